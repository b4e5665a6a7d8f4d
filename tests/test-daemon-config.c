/* test-daemon-config.c: beed's flags and config file (daemon/config.c).
 *
 * Every flag, the file-then-flags precedence, each class of error with the
 * flag or FILE:LINE named in the message, CRLF files and the line-length
 * bound.  Config files are written to a fresh temporary directory.
 */
#include "averager.h"
#include "bee.h"
#include "loss-scale-cases.h"
#include "test.h"

#include <errno.h>
#include <stdarg.h>
#include <unistd.h>

#define MOD_HEX                                                                \
  "00112233445566778899aabbccddeeff"                                           \
  "00112233445566778899AABBCCDDEEFF"

static char tmpdir[256];
static char err[512];

/* Parses the NULL-terminated flags after cfg. */
static int parse(bee_config *cfg, ...) {
  char *argv[200];
  int argc = 0;
  va_list ap;
  argv[argc++] = "beed";
  va_start(ap, cfg);
  for (char *a; (a = va_arg(ap, char *)) != NULL;)
    argv[argc++] = a;
  va_end(ap);
  argv[argc] = NULL;
  err[0] = '\0';
  return bee_config_parse(cfg, argc, argv, err, sizeof err);
}

/* Writes n bytes to a file in tmpdir and returns its path (static). */
static const char *write_file(const char *name, const char *text, size_t n) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  ASSERT(f != NULL);
  ASSERT_EQ(fwrite(text, 1, n, f), n);
  ASSERT_EQ(fclose(f), 0);
  return path;
}

static const char *conf(const char *text) {
  return write_file("beed.conf", text, strlen(text));
}

/* err must contain want. */
#define ASSERT_ERR(want)                                                       \
  do {                                                                         \
    if (!strstr(err, (want)))                                                  \
      FAIL("error \"%s\" does not mention \"%s\"", err, (want));               \
  } while (0)

static void test_defaults(void) {
  bee_config c;
  ASSERT_OK(parse(&c, "--open", NULL));
  ASSERT_STREQ(c.listen, "0.0.0.0:45555");
  ASSERT_STREQ(c.identity, "beed.key");
  ASSERT_STREQ(c.swarm, "beed");
  ASSERT_EQ(c.njoin, 0);
  ASSERT_EQ(c.log_level, BEE_LOG_INFO);
  ASSERT_EQ(c.max_conns, 1024);
  ASSERT_EQ(c.status_interval_s, 10);
  ASSERT(c.open && !c.moderated && !c.no_listen && !c.help && !c.version);
  ASSERT_STREQ(c.token, "");
  ASSERT_STREQ(c.revocations, "");
  ASSERT_STREQ(c.config, "");
  /* No training without a run id; the training settings' defaults. */
  ASSERT_STREQ(c.run, "");
  ASSERT_STREQ(c.model, "mlp");
  ASSERT_STREQ(c.data, "/usr/share/datasets/fashion-mnist");
  ASSERT_EQ(c.batch_size, 64);
  ASSERT_EQ(c.target_batch_size, 4096);
  ASSERT(c.lr == 0 && bee_config_lr(&c) == 0.05); /* SGD's default */
  ASSERT_EQ(c.optimizer, BEE_OPT_SGD);
  ASSERT_EQ(c.averaging, BEE_AVG_GRADIENTS);
  ASSERT_EQ(c.average_state_every, 0);
  ASSERT(c.matchmaking_s == 2.0);
  ASSERT_STREQ(c.label, "");
  ASSERT_EQ(c.threads, 1);
  ASSERT_EQ(c.eval_every, 1);
}

static void expect_flag_error(const char *flag, const char *value);

/* tools/systemd's example config is one beed accepts as it is. */
static void test_systemd_example(void) {
  bee_config c;
  bee_config_init(&c);
  ASSERT_OK(bee_config_load_file(
      &c, BEE_SOURCE_ROOT "/tools/systemd/beed.conf.example", err, sizeof err));
  ASSERT_OK(bee_config_check(&c, err, sizeof err));
  ASSERT(c.moderated && c.resume);
  ASSERT_STREQ(c.run, "fmnist-cnn");
  ASSERT_STREQ(c.checkpoint_dir, "checkpoints");
  ASSERT_STREQ(c.peers_file, "known-peers");
  ASSERT_EQ(c.njoin, 1);
}

static void test_training_flags(void) {
  bee_config c;
  ASSERT_OK(parse(&c, "--open", "--run-id", "fmnist-1.a_b", "--model", "cnn",
                  "--data", "/d/mnist", "--batch-size", "4096",
                  "--target-batch-size", "32768", "--lr", "1e-3", "--label",
                  "eu-west \xc3\xa9t\xc3\xa9", "--threads", "64",
                  "--eval-every", "0", NULL));
  ASSERT_STREQ(c.run, "fmnist-1.a_b");
  ASSERT_STREQ(c.model, "cnn");
  ASSERT_STREQ(c.data, "/d/mnist");
  ASSERT_EQ(c.batch_size, 4096);
  ASSERT_EQ(c.target_batch_size, 32768);
  ASSERT(c.lr == 1e-3);
  ASSERT_STREQ(c.label, "eu-west \xc3\xa9t\xc3\xa9");
  ASSERT_EQ(c.threads, 64);
  ASSERT_EQ(c.eval_every, 0);
  /* The same from a file. */
  const char text[] = "open = true\nrun-id = r\nmodel = mlp\n"
                      "target-batch-size = 1\nlabel = us east  # comment\n";
  const char *path = write_file("train.conf", text, sizeof text - 1);
  ASSERT_OK(parse(&c, "--config", path, NULL));
  ASSERT_STREQ(c.run, "r");
  ASSERT_EQ(c.target_batch_size, 1);
  ASSERT_STREQ(c.label, "us east");
  unlink(path);

  char run[PROTO_RUN_MAX + 2];
  memset(run, 'r', sizeof run - 1);
  run[PROTO_RUN_MAX + 1] = '\0';
  expect_flag_error("--run-id", run); /* one byte over */
  run[PROTO_RUN_MAX] = '\0';
  ASSERT_OK(parse(&c, "--open", "--run-id", run, NULL));
  const char *bad_run[] = {"", "a b", "a/b", "r\xc3\xa9", "a:b"};
  for (size_t i = 0; i < sizeof bad_run / sizeof *bad_run; i++)
    expect_flag_error("--run-id", bad_run[i]);
  const char *bad_label[] = {"tab\there", "nl\n", "\x7f", "\xc3", "\xc0\x80"};
  for (size_t i = 0; i < sizeof bad_label / sizeof *bad_label; i++)
    expect_flag_error("--label", bad_label[i]);
  char label[PROTO_LABEL_MAX + 2];
  memset(label, 'l', sizeof label - 1);
  label[PROTO_LABEL_MAX + 1] = '\0';
  expect_flag_error("--label", label);
  expect_flag_error("--model", "vgg");
  expect_flag_error("--model", "MLP");
  expect_flag_error("--data", "");
  const char *bad_batch[] = {"0", "4097", "-1", "1.5", "x"};
  for (size_t i = 0; i < sizeof bad_batch / sizeof *bad_batch; i++)
    expect_flag_error("--batch-size", bad_batch[i]);
  expect_flag_error("--target-batch-size", "0");
  expect_flag_error("--target-batch-size", "1000000001");
  const char *bad_lr[] = {"0", "-0.1", "nan", "inf", "101", "0.1x", "", "1e400"};
  for (size_t i = 0; i < sizeof bad_lr / sizeof *bad_lr; i++)
    expect_flag_error("--lr", bad_lr[i]);
  expect_flag_error("--threads", "0");
  expect_flag_error("--threads", "65");
  expect_flag_error("--eval-every", "-1");

  /* Optimizers and averaging modes. */
  ASSERT_OK(parse(&c, "--open", "--optimizer", "adamw", NULL));
  ASSERT(c.optimizer == BEE_OPT_ADAMW && bee_config_lr(&c) == 1e-3);
  ASSERT_OK(parse(&c, "--open", "--optimizer", "lamb", "--lr", "0.01", NULL));
  ASSERT(c.optimizer == BEE_OPT_LAMB && bee_config_lr(&c) == 0.01);
  ASSERT_STREQ(bee_optimizer_name(c.optimizer), "lamb");
  expect_flag_error("--optimizer", "adam");
  expect_flag_error("--optimizer", "");
  ASSERT_OK(parse(&c, "--open", "--averaging", "diloco", NULL));
  ASSERT_EQ(c.averaging, BEE_AVG_DILOCO);
  ASSERT_EQ(bee_config_inner_steps(&c), 50);
  ASSERT(bee_config_outer_lr(&c) == 0.7 && bee_config_outer_momentum(&c) == 0.9);
  ASSERT_OK(parse(&c, "--open", "--averaging", "diloco", "--inner-steps", "500",
                  "--outer-lr", "0.5", "--outer-momentum", "0", NULL));
  ASSERT_EQ(bee_config_inner_steps(&c), 500);
  ASSERT(bee_config_outer_lr(&c) == 0.5 && bee_config_outer_momentum(&c) == 0);
  ASSERT_STREQ(bee_averaging_name(c.averaging), "diloco");
  /* The outer step's settings without DiLoCo are a mistake. */
  const char *diloco_only[] = {"--inner-steps", "--outer-lr",
                               "--outer-momentum"};
  for (size_t i = 0; i < 3; i++) {
    ASSERT_RC(parse(&c, "--open", diloco_only[i], "0.5", NULL), BEE_ECONFIG);
    if (i == 0) /* 0.5 is no step count: the value is refused first */
      ASSERT_ERR("--inner-steps: bad number");
    else
      ASSERT_ERR("are for --averaging diloco");
  }
  ASSERT_RC(parse(&c, "--open", "--inner-steps", "5", NULL), BEE_ECONFIG);
  ASSERT_ERR("are for --averaging diloco");
  expect_flag_error("--averaging", "state");
  const char *bad_inner[] = {"0", "1000001", "-1", "x"};
  for (size_t i = 0; i < sizeof bad_inner / sizeof *bad_inner; i++)
    expect_flag_error("--inner-steps", bad_inner[i]);
  const char *bad_mom[] = {"1", "-0.1", "nan", "0.9x", ""};
  for (size_t i = 0; i < sizeof bad_mom / sizeof *bad_mom; i++)
    expect_flag_error("--outer-momentum", bad_mom[i]);
  expect_flag_error("--outer-lr", "0");
  ASSERT_OK(parse(&c, "--open", "--average-state-every", "10",
                  "--matchmaking-time", "7.5", NULL));
  ASSERT_EQ(c.average_state_every, 10);
  ASSERT(c.matchmaking_s == 7.5);
  ASSERT_EQ(c.min_peers, 1);
  ASSERT(!c.delay_averaging);
  ASSERT(!c.no_match_ahead);
  ASSERT_OK(parse(&c, "--open", "--delay-averaging", "--no-match-ahead", NULL));
  ASSERT(c.delay_averaging);
  ASSERT(c.no_match_ahead);
  ASSERT_EQ(c.compression, AVG_NONE);
  ASSERT(!c.error_feedback);
  ASSERT_OK(parse(&c, "--open", "--compression", "b8", "--error-feedback",
                  NULL));
  ASSERT_EQ(c.compression, AVG_B8);
  ASSERT(c.error_feedback);
  ASSERT_OK(parse(&c, "--open", "--compression", "fp16", NULL));
  ASSERT_EQ(c.compression, AVG_FP16);
  expect_flag_error("--compression", "int8");
  ASSERT_ERR("bad compression 'int8' (want none, fp16, bf16, u8 or b8)");
  ASSERT_RC(parse(&c, "--open", "--error-feedback", NULL), BEE_ECONFIG);
  ASSERT_ERR("--error-feedback is for a lossy --compression");
  ASSERT_RC(parse(&c, "--open", "--compression", "none", "--error-feedback",
                  NULL),
            BEE_ECONFIG);
  ASSERT_RC(parse(&c, "--open", "--delay-averaging", "--averaging", "diloco",
                  NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--delay-averaging is for gradient averaging");
  ASSERT_OK(parse(&c, "--open", "--min-peers", "8", NULL));
  ASSERT_EQ(c.min_peers, 8);
  expect_flag_error("--min-peers", "0");
  expect_flag_error("--min-peers", "x");
  ASSERT_EQ(c.group_size, 0);
  ASSERT_OK(parse(&c, "--open", "--group-size", "8", "--average-state-every",
                  "1", NULL));
  ASSERT_EQ(c.group_size, 8);
  ASSERT_OK(parse(&c, "--open", "--group-size", "8", "--average-state-every",
                  "4", "--averaging", "diloco", NULL));
  expect_flag_error("--group-size", "1");
  expect_flag_error("--group-size", "1025");
  expect_flag_error("--group-size", "eight");
  ASSERT_RC(parse(&c, "--open", "--group-size", "8", NULL), BEE_ECONFIG);
  ASSERT_ERR("--group-size needs --average-state-every N");
  ASSERT_RC(parse(&c, "--open", "--group-size", "8", "--average-state-every",
                  "1", "--delay-averaging", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--group-size and --delay-averaging");
  ASSERT_EQ(c.max_state_uploads, BEE_DEFAULT_STATE_UPLOADS);
  ASSERT_OK(parse(&c, "--open", "--max-state-uploads", "1", NULL));
  ASSERT_EQ(c.max_state_uploads, 1);
  ASSERT_OK(parse(&c, "--open", "--max-state-uploads", "64", NULL));
  ASSERT_EQ(c.max_state_uploads, 64);
  expect_flag_error("--max-state-uploads", "0");
  expect_flag_error("--max-state-uploads", "65");
  expect_flag_error("--max-state-uploads", "two");
  /* Learning-rate schedules. */
  ASSERT_EQ(c.lr_schedule, BEE_SCHED_CONSTANT);
  ASSERT_OK(parse(&c, "--open", "--lr-schedule", "cosine", "--total-epochs",
                  "100", "--warmup-epochs", "5", "--min-lr", "1e-5", NULL));
  ASSERT_EQ(c.lr_schedule, BEE_SCHED_COSINE);
  ASSERT_EQ(c.total_epochs, 100);
  ASSERT_EQ(c.warmup_epochs, 5);
  ASSERT(c.min_lr == 1e-5);
  ASSERT_OK(parse(&c, "--open", "--lr-schedule", "linear", "--total-epochs",
                  "3", NULL));
  ASSERT_EQ(c.lr_schedule, BEE_SCHED_LINEAR);
  ASSERT_OK(parse(&c, "--open", "--warmup-epochs", "10", NULL));
  ASSERT_EQ(c.lr_schedule, BEE_SCHED_CONSTANT);
  expect_flag_error("--lr-schedule", "step");
  expect_flag_error("--total-epochs", "0");
  expect_flag_error("--warmup-epochs", "-1");
  expect_flag_error("--min-lr", "-0.1");
  expect_flag_error("--min-lr", "nan");
  ASSERT_RC(parse(&c, "--open", "--lr-schedule", "cosine", NULL), BEE_ECONFIG);
  ASSERT_ERR("--lr-schedule cosine needs --total-epochs");
  ASSERT_RC(parse(&c, "--open", "--total-epochs", "9", NULL), BEE_ECONFIG);
  ASSERT_ERR("--total-epochs and --min-lr are for --lr-schedule");
  ASSERT_RC(parse(&c, "--open", "--min-lr", "0", NULL), BEE_ECONFIG);
  ASSERT_ERR("--total-epochs and --min-lr are for --lr-schedule");
  ASSERT_RC(parse(&c, "--open", "--lr-schedule", "linear", "--total-epochs",
                  "5", "--warmup-epochs", "5", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--warmup-epochs (5) must be fewer than --total-epochs (5)");
  ASSERT_RC(parse(&c, "--open", "--lr-schedule", "linear", "--total-epochs",
                  "5", "--optimizer", "adamw", "--min-lr", "0.001", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--min-lr (0.001) must be below the learning rate (0.001)");
  expect_flag_error("--average-state-every", "-1");
  const char *bad_mm[] = {"0", "601", "-1", "inf", "2s"};
  for (size_t i = 0; i < sizeof bad_mm / sizeof *bad_mm; i++)
    expect_flag_error("--matchmaking-time", bad_mm[i]);
  /* And from a file. */
  const char text2[] = "open = true\naveraging = diloco\ninner-steps = 9\n"
                       "optimizer = lamb\naverage-state-every = 3\n";
  const char *path2 = write_file("diloco.conf", text2, sizeof text2 - 1);
  ASSERT_OK(parse(&c, "--config", path2, NULL));
  ASSERT(c.averaging == BEE_AVG_DILOCO && c.inner_steps == 9 &&
         c.optimizer == BEE_OPT_LAMB && c.average_state_every == 3);
  unlink(path2);

  /* Checkpoints. */
  ASSERT_OK(parse(&c, "--open", "--run-id", "r", NULL));
  ASSERT_STREQ(c.checkpoint_dir, "");
  ASSERT_EQ(c.checkpoint_every, 1);
  ASSERT_EQ(c.keep_checkpoints, 3);
  ASSERT(!c.resume);
  ASSERT_OK(parse(&c, "--open", "--run-id", "r", "--checkpoint-dir", "/var/ck",
                  "--checkpoint-every", "5", "--keep-checkpoints", "1",
                  "--resume", NULL));
  ASSERT_STREQ(c.checkpoint_dir, "/var/ck");
  ASSERT_EQ(c.checkpoint_every, 5);
  ASSERT_EQ(c.keep_checkpoints, 1);
  ASSERT(c.resume);
  ASSERT_RC(parse(&c, "--open", "--checkpoint-dir", "/var/ck", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--run-id");
  ASSERT_RC(parse(&c, "--open", "--run-id", "r", "--resume", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--resume needs --checkpoint-dir");
  ASSERT_RC(parse(&c, "--open", "--run-id", "r", "--checkpoint-dir", "d",
                  "--checkpoint-every", "0", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--checkpoint-every");
  ASSERT_RC(parse(&c, "--open", "--run-id", "r", "--checkpoint-dir", "d",
                  "--keep-checkpoints", "x", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--keep-checkpoints");
  ASSERT_RC(parse(&c, "--open", "--run-id", "r", "--checkpoint-dir", "", NULL),
            BEE_ECONFIG);
}

static void test_every_flag(void) {
  bee_config c;
  ASSERT_OK(parse(&c, "--listen", "127.0.0.1:5000", "--join", "10.0.0.1:1",
                  "--join", "[::1]:45555", "--join", "node-3.example.org:9",
                  "--identity", "/k/id.key", "--moderator", MOD_HEX, "--token",
                  "t.tok", "--swarm", "My_swarm-1.0", "--revocations", "r.rev",
                  "--log-level", "debug", "--max-conns", "65536", "--no-listen",
                  "--status-interval", "0", NULL));
  ASSERT_STREQ(c.listen, "127.0.0.1:5000");
  ASSERT_EQ(c.njoin, 3);
  ASSERT_STREQ(c.join[0], "10.0.0.1:1");
  ASSERT_STREQ(c.join[1], "[::1]:45555");
  ASSERT_STREQ(c.join[2], "node-3.example.org:9");
  ASSERT_STREQ(c.identity, "/k/id.key");
  ASSERT(c.moderated && !c.open);
  ASSERT_EQ(c.moderator_pk[0], 0x00);
  ASSERT_EQ(c.moderator_pk[1], 0x11);
  ASSERT_EQ(c.moderator_pk[15], 0xff);
  ASSERT_EQ(c.moderator_pk[31], 0xff);
  ASSERT_STREQ(c.token, "t.tok");
  ASSERT_STREQ(c.swarm, "My_swarm-1.0");
  ASSERT_STREQ(c.revocations, "r.rev");
  ASSERT_EQ(c.log_level, BEE_LOG_DEBUG);
  ASSERT_EQ(c.max_conns, 65536);
  ASSERT(c.no_listen);
  ASSERT_EQ(c.status_interval_s, 0);

  /* --name=value, the other listen forms, the limits of each number. */
  ASSERT_OK(parse(&c, "--open", "--listen=[::]:0", "--max-conns=1",
                  "--status-interval=86400", "--log-level=error", NULL));
  ASSERT_STREQ(c.listen, "[::]:0");
  ASSERT_EQ(c.max_conns, 1);
  ASSERT_EQ(c.status_interval_s, 86400);
  ASSERT_EQ(c.log_level, BEE_LOG_ERROR);
  ASSERT_OK(parse(&c, "--open", "--listen", ":45556", NULL));
  ASSERT_STREQ(c.listen, ":45556");
  ASSERT_OK(parse(&c, "--open", "--log-level", "warn", NULL));
  ASSERT_EQ(c.log_level, BEE_LOG_WARN);

  /* A later value wins for single settings. */
  ASSERT_OK(parse(&c, "--open", "--swarm", "a", "--swarm", "b", NULL));
  ASSERT_STREQ(c.swarm, "b");

  /* --clip: auto (the default), off, a factor of 2 to 1e6. */
  ASSERT_OK(parse(&c, "--open", NULL));
  ASSERT(c.clip == BEE_CLIP_AUTO);
  ASSERT_OK(parse(&c, "--open", "--clip", "off", NULL));
  ASSERT(c.clip == 0);
  ASSERT_OK(parse(&c, "--open", "--clip", "off", "--clip", "auto", NULL));
  ASSERT(c.clip == BEE_CLIP_AUTO);
  ASSERT_OK(parse(&c, "--open", "--clip", "2.5", NULL));
  ASSERT(c.clip == 2.5);
  const char *bad_clip[] = {"1.5", "0", "-3", "nan", "inf", "1e7", "10x", ""};
  for (size_t i = 0; i < sizeof bad_clip / sizeof *bad_clip; i++) {
    ASSERT_RC(parse(&c, "--open", "--clip", bad_clip[i], NULL), BEE_ECONFIG);
    ASSERT_ERR("--clip: bad clip");
  }

  /* --bandwidth: auto (0, the default) or Mbit/s from 0.1 to a Tbit/s. */
  ASSERT_OK(parse(&c, "--open", NULL));
  ASSERT(c.bandwidth_mbit == 0);
  ASSERT_OK(parse(&c, "--open", "--bandwidth", "250", NULL));
  ASSERT(c.bandwidth_mbit == 250);
  ASSERT_OK(
      parse(&c, "--open", "--bandwidth", "250", "--bandwidth", "auto", NULL));
  ASSERT(c.bandwidth_mbit == 0);
  const char *bad_bw[] = {"0", "0.05", "-1", "nan", "inf", "2e6", "1g", ""};
  for (size_t i = 0; i < sizeof bad_bw / sizeof *bad_bw; i++) {
    ASSERT_RC(parse(&c, "--open", "--bandwidth", bad_bw[i], NULL), BEE_ECONFIG);
    ASSERT_ERR("--bandwidth: bad bandwidth");
  }

  /* --announce: names and IPv6 too, in order, up to BEE_ANNOUNCE_MAX; no
   * port 0, no unspecified address, no port-less host. */
  ASSERT_OK(parse(&c, "--open", "--announce", "bee-7.example.org:45555",
                  "--announce", "[2001:db8::7]:45555", NULL));
  ASSERT_EQ(c.nannounce, 2);
  ASSERT_STREQ(c.announce[0], "bee-7.example.org:45555");
  ASSERT_STREQ(c.announce[1], "[2001:db8::7]:45555");
  ASSERT_OK(parse(&c, "--open", NULL));
  ASSERT_EQ(c.nannounce, 0);
  ASSERT_RC(parse(&c, "--open", "--announce", "10.0.0.1:0", NULL), BEE_ECONFIG);
  ASSERT_ERR("--announce: bad address '10.0.0.1:0'");
  ASSERT_RC(parse(&c, "--open", "--announce", "0.0.0.0:45555", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("no address a peer can dial");
  ASSERT_RC(parse(&c, "--open", "--announce", "[::]:45555", NULL), BEE_ECONFIG);
  ASSERT_ERR("no address a peer can dial");
  ASSERT_RC(parse(&c, "--open", "--announce", "bee-7", NULL), BEE_ECONFIG);
  ASSERT_ERR("--announce: bad address");
  ASSERT_RC(parse(&c, "--open", "--announce", "a:1", "--announce", "b:1",
                  "--announce", "c:1", "--announce", "d:1", "--announce", "e:1",
                  NULL),
            BEE_ECONFIG);
  ASSERT_ERR("more than 4 --announce");

  /* 64 joins fit, the 65th does not. */
  char *argv[2 + 2 * (BEE_JOIN_MAX + 1)];
  char addrs[BEE_JOIN_MAX + 1][32];
  int argc = 0;
  argv[argc++] = "beed";
  argv[argc++] = "--open";
  for (int i = 0; i < BEE_JOIN_MAX; i++) {
    snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", 1000 + i);
    argv[argc++] = "--join";
    argv[argc++] = addrs[i];
  }
  ASSERT_OK(bee_config_parse(&c, argc, argv, err, sizeof err));
  ASSERT_EQ(c.njoin, BEE_JOIN_MAX);
  ASSERT_STREQ(c.join[63], "127.0.0.1:1063");
  snprintf(addrs[BEE_JOIN_MAX], sizeof addrs[0], "127.0.0.1:2000");
  argv[argc++] = "--join";
  argv[argc++] = addrs[BEE_JOIN_MAX];
  ASSERT_RC(bee_config_parse(&c, argc, argv, err, sizeof err), BEE_ECONFIG);
  ASSERT_ERR("--join");
}

static void test_help_version(void) {
  bee_config c;
  ASSERT_OK(parse(&c, "--help", NULL));
  ASSERT(c.help && !c.version);
  ASSERT_OK(parse(&c, "-h", NULL));
  ASSERT(c.help);
  ASSERT_OK(parse(&c, "--version", NULL));
  ASSERT(c.version && !c.help);
  /* --help wins over what would otherwise be an error. */
  ASSERT_OK(parse(&c, "--max-conns", "0", "--help", NULL));
  ASSERT(c.help);
  ASSERT_OK(parse(&c, "--config", "/nonexistent/beed.conf", "--version", NULL));
  ASSERT(c.version);
}

static void test_file(void) {
  bee_config c;
  const char *p = conf("# a beed config\n"
                       "\n"
                       "   listen = 127.0.0.1:6000   \n"
                       "join = 10.0.0.1:45555\n"
                       "join=10.0.0.2:45555  # the second\n"
                       "announce = bee.example.org:45555\n"
                       "\tswarm\t=\tlab-1\n"
                       "moderator = " MOD_HEX "\n"
                       "token = /etc/beed/node.tok\n"
                       "identity = /etc/beed/node#1.key\n"
                       "revocations = /etc/beed/revoked\n"
                       "log-level = debug\n"
                       "max-conns = 77\n"
                       "status-interval = 3\n"
                       "no-listen = false\n"
                       "open = false\n");
  ASSERT_OK(parse(&c, "--config", p, NULL));
  ASSERT_STREQ(c.config, p);
  ASSERT_STREQ(c.listen, "127.0.0.1:6000");
  ASSERT_EQ(c.njoin, 2);
  ASSERT_STREQ(c.join[0], "10.0.0.1:45555");
  ASSERT_STREQ(c.join[1], "10.0.0.2:45555");
  ASSERT_STREQ(c.swarm, "lab-1");
  ASSERT(c.moderated && !c.open && !c.no_listen);
  ASSERT_STREQ(c.token, "/etc/beed/node.tok");
  ASSERT_STREQ(c.identity, "/etc/beed/node#1.key"); /* '#' inside a value */
  ASSERT_STREQ(c.revocations, "/etc/beed/revoked");
  ASSERT_EQ(c.log_level, BEE_LOG_DEBUG);
  ASSERT_EQ(c.max_conns, 77);
  ASSERT_EQ(c.status_interval_s, 3);

  /* Flags override the file, wherever --config stands. */
  ASSERT_OK(parse(&c, "--listen", ":7000", "--config", p, "--max-conns", "9",
                  "--swarm", "lab-2", NULL));
  ASSERT_STREQ(c.listen, ":7000");
  ASSERT_EQ(c.max_conns, 9);
  ASSERT_STREQ(c.swarm, "lab-2");
  ASSERT_EQ(c.njoin, 2); /* no --join: the file's list stays */
  ASSERT_EQ(c.nannounce, 1);
  ASSERT_STREQ(c.announce[0], "bee.example.org:45555");
  /* --announce replaces the file's list. */
  ASSERT_OK(parse(&c, "--config", p, "--announce", "10.1.2.3:1", NULL));
  ASSERT_EQ(c.nannounce, 1);
  ASSERT_STREQ(c.announce[0], "10.1.2.3:1");
  ASSERT_EQ(c.status_interval_s, 3);

  /* --join replaces the file's list; several --join accumulate. */
  ASSERT_OK(parse(&c, "--config", p, "--join", "10.9.9.9:1", "--join",
                  "10.9.9.8:2", NULL));
  ASSERT_EQ(c.njoin, 2);
  ASSERT_STREQ(c.join[0], "10.9.9.9:1");
  ASSERT_STREQ(c.join[1], "10.9.9.8:2");

  /* Booleans: a file's true, a flag over a file's false. */
  p = conf("open = true\nno-listen = true\n");
  ASSERT_OK(parse(&c, "--config", p, NULL));
  ASSERT(c.open && c.no_listen);
  p = conf("no-listen = false\nopen = false\n");
  ASSERT_OK(parse(&c, "--config", p, "--open", "--no-listen", NULL));
  ASSERT(c.open && c.no_listen);

  /* The file alone can also be the whole configuration check. */
  p = conf("moderator = " MOD_HEX "\n");
  ASSERT_RC(parse(&c, "--config", p, NULL), BEE_ECONFIG);
  ASSERT_ERR("--token");
  ASSERT_OK(parse(&c, "--config", p, "--token", "x.tok", NULL));

  /* An empty file and a file without a final newline. */
  p = conf("");
  ASSERT_OK(parse(&c, "--config", p, "--open", NULL));
  p = conf("open = true\nswarm = last");
  ASSERT_OK(parse(&c, "--config", p, NULL));
  ASSERT_STREQ(c.swarm, "last");
}

static void test_crlf(void) {
  bee_config c;
  const char *p = conf("# windows\r\n"
                       "\r\n"
                       "open = true\r\n"
                       "swarm = crlf\r\n"
                       "join = 127.0.0.1:45555\r\n"
                       "status-interval = 1\r\n");
  ASSERT_OK(parse(&c, "--config", p, NULL));
  ASSERT(c.open);
  ASSERT_STREQ(c.swarm, "crlf");
  ASSERT_EQ(c.njoin, 1);
  ASSERT_STREQ(c.join[0], "127.0.0.1:45555");
  ASSERT_EQ(c.status_interval_s, 1);
}

static void test_long_lines(void) {
  bee_config c;
  size_t cap = 2 * 1024 * 1024;
  char *buf = malloc(cap);
  ASSERT(buf != NULL);

  /* A comment of exactly BEE_LINE_MAX bytes, with \n and with \r\n. */
  memset(buf, '#', BEE_LINE_MAX);
  memcpy(buf + BEE_LINE_MAX, "\nopen = true\n", 13);
  ASSERT_OK(parse(&c, "--config",
                  write_file("max.conf", buf, BEE_LINE_MAX + 13), NULL));
  ASSERT(c.open);
  memcpy(buf + BEE_LINE_MAX, "\r\nopen = true\r\n", 15);
  ASSERT_OK(parse(&c, "--config",
                  write_file("max.conf", buf, BEE_LINE_MAX + 15), NULL));

  /* One byte more is refused, naming the line. */
  memset(buf, '#', BEE_LINE_MAX + 1);
  memcpy(buf + BEE_LINE_MAX + 1, "\nopen = true\n", 13);
  const char *p = write_file("long.conf", buf, BEE_LINE_MAX + 14);
  ASSERT_RC(parse(&c, "--config", p, NULL), BEE_ECONFIG);
  ASSERT_ERR("long.conf:1:");
  ASSERT_ERR("longer than 4096");

  /* A 2 MiB line without a newline, on line 3. */
  memcpy(buf, "open = true\n\n", 13);
  memset(buf + 13, 'x', cap - 13);
  p = write_file("huge.conf", buf, cap);
  ASSERT_RC(parse(&c, "--config", p, NULL), BEE_ECONFIG);
  ASSERT_ERR("huge.conf:3:");

  /* A long value is read whole and judged as a value. */
  memcpy(buf, "swarm = ", 8);
  memset(buf + 8, 'a', 3000);
  buf[3008] = '\n';
  p = write_file("val.conf", buf, 3009);
  ASSERT_RC(parse(&c, "--open", "--config", p, NULL), BEE_ECONFIG);
  ASSERT_ERR("val.conf:1: swarm: bad swarm name");

  /* NUL bytes are refused. */
  p = write_file("nul.conf", "open = true\nswarm = a\0b\n", 24);
  ASSERT_RC(parse(&c, "--config", p, NULL), BEE_ECONFIG);
  ASSERT_ERR("nul.conf:2:");
  free(buf);
}

/* Each flag error must return BEE_ECONFIG and name the flag. */
static void expect_flag_error(const char *flag, const char *value) {
  bee_config c;
  ASSERT_RC(parse(&c, "--open", flag, value, NULL), BEE_ECONFIG);
  ASSERT_ERR(flag);
}

static void test_flag_errors(void) {
  bee_config c;
  ASSERT_RC(parse(&c, "--open", "--bogus", NULL), BEE_ECONFIG);
  ASSERT_ERR("unknown flag '--bogus'");
  ASSERT_RC(parse(&c, "--open", "--bogus=1", NULL), BEE_ECONFIG);
  ASSERT_ERR("'--bogus'");
  ASSERT_RC(parse(&c, "--open", "-x", NULL), BEE_ECONFIG);
  ASSERT_ERR("unknown flag '-x'");
  ASSERT_RC(parse(&c, "--open", "stray", NULL), BEE_ECONFIG);
  ASSERT_ERR("unexpected argument 'stray'");
  ASSERT_RC(parse(&c, "--open", "--", NULL), BEE_ECONFIG);

  /* Missing values: at the end, or followed by another flag. */
  ASSERT_RC(parse(&c, "--open", "--join", NULL), BEE_ECONFIG);
  ASSERT_ERR("missing value for --join");
  ASSERT_RC(parse(&c, "--swarm", "--open", NULL), BEE_ECONFIG);
  ASSERT_ERR("missing value for --swarm");
  ASSERT_RC(parse(&c, "--open", "--token", NULL), BEE_ECONFIG);
  ASSERT_ERR("--token");
  ASSERT_RC(parse(&c, "--open", "--open=yes", NULL), BEE_ECONFIG);
  ASSERT_ERR("--open takes no value");

  /* Bad numbers. */
  const char *bad_conns[] = {"0",  "65537", "abc", "-1",          "+5",
                             " 5", "5x",    "",    "99999999999", "1e3"};
  for (size_t i = 0; i < sizeof bad_conns / sizeof *bad_conns; i++)
    expect_flag_error("--max-conns", bad_conns[i]);
  expect_flag_error("--status-interval", "86401");
  expect_flag_error("--status-interval", "-1");
  expect_flag_error("--status-interval", "1.5");

  /* Bad addresses. */
  const char *bad_listen[] = {
      "1.2.3.4",  "1.2.3.4:",  "1.2.3.4:65536", "::1:80",
      "[::1]80",  "[::1]:",    "[zz]:80",       "localhost:80",
      "1.2.3:80", "1.2.3.4:x", "1.2.3.4:-1",    "",
      ":",        "[::1:80"};
  for (size_t i = 0; i < sizeof bad_listen / sizeof *bad_listen; i++)
    expect_flag_error("--listen", bad_listen[i]);
  const char *bad_join[] = {":80",      "1.2.3.4:0", "host",
                            "ho st:80", "a..b:80",   "1.2.3:80",
                            "host:",    "[::1]:0",   "-:80x"};
  for (size_t i = 0; i < sizeof bad_join / sizeof *bad_join; i++)
    expect_flag_error("--join", bad_join[i]);
  char longhost[300];
  memset(longhost, 'a', 270);
  memcpy(longhost + 270, ":80", 4);
  expect_flag_error("--join", longhost);

  /* Bad public keys. */
  expect_flag_error("--moderator", "00");
  expect_flag_error("--moderator", MOD_HEX "00");
  char badhex[] = MOD_HEX;
  badhex[10] = 'g';
  expect_flag_error("--moderator", badhex);
  ASSERT_RC(parse(&c, "--moderator", MOD_HEX "0", "--token", "t", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--moderator: bad public key");

  /* Bad names and levels, empty paths. */
  char longname[PROTO_SWARM_MAX + 2];
  memset(longname, 's', PROTO_SWARM_MAX + 1);
  longname[PROTO_SWARM_MAX + 1] = '\0';
  expect_flag_error("--swarm", longname);
  longname[PROTO_SWARM_MAX] = '\0';
  ASSERT_OK(parse(&c, "--open", "--swarm", longname, NULL));
  expect_flag_error("--swarm", "");
  expect_flag_error("--swarm", "a b");
  expect_flag_error("--swarm", "a/b");
  expect_flag_error("--swarm", "caf\xc3\xa9");
  expect_flag_error("--log-level", "verbose");
  expect_flag_error("--log-level", "INFO");
  expect_flag_error("--identity", "");
  expect_flag_error("--revocations", "");
  char longpath[BEE_PATH_MAX + 1];
  memset(longpath, 'p', BEE_PATH_MAX);
  longpath[BEE_PATH_MAX] = '\0';
  expect_flag_error("--identity", longpath);
}

/* Each model's own settings, from flags and from a file, and the
 * settings that belong to another model refused. */
static void test_model_flags(void) {
  bee_config c;
  ASSERT_OK(parse(&c, "--open", "--run-id", "lm", "--model", "gpt",
                  "--tokens", "t.bin", "--val-tokens", "v.bin", "--vocab",
                  "65536", "--ctx", "1024", "--layers", "12", "--heads", "12",
                  "--embd", "768", NULL));
  ASSERT_STREQ(c.model, "gpt");
  ASSERT_STREQ(c.tokens, "t.bin");
  ASSERT_STREQ(c.val_tokens, "v.bin");
  ASSERT(c.vocab == 65536 && c.ctx == 1024 && c.layers == 12 &&
         c.heads == 12 && c.embd == 768);
  const char *p = conf("open = true\nrun-id = img\nmodel = resnet\n"
                       "depth = 56\nwidth = 16\naugment = true\n"
                       "data = /d/cifar\n");
  ASSERT_OK(parse(&c, "--config", p, NULL));
  ASSERT(strcmp(c.model, "resnet") == 0 && c.depth == 56 && c.width == 16 &&
         c.augment && !c.batchnorm);
  ASSERT_OK(parse(&c, "--open", "--model", "cnn", "--batchnorm", NULL));
  ASSERT(c.batchnorm);
  expect_flag_error("--depth", "7");
  expect_flag_error("--width", "0");
  expect_flag_error("--vocab", "65537");
  expect_flag_error("--ctx", "x");
  expect_flag_error("--heads", "-1");
  ASSERT_RC(parse(&c, "--open", "--run-id", "lm", "--model", "gpt", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--model gpt trains on --tokens FILE");
  ASSERT_RC(parse(&c, "--open", "--tokens", "t.bin", NULL), BEE_ECONFIG);
  ASSERT_ERR("are for --model gpt");
  ASSERT_RC(parse(&c, "--open", "--model", "cnn", "--heads", "2", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("are for --model gpt");
  ASSERT_RC(parse(&c, "--open", "--model", "gpt", "--tokens", "t", "--augment",
                  NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--augment is for images");
  ASSERT_RC(parse(&c, "--open", "--depth", "20", NULL), BEE_ECONFIG);
  ASSERT_ERR("--depth and --width are for --model resnet");
  ASSERT_RC(parse(&c, "--open", "--model", "resnet", "--batchnorm", NULL),
            BEE_ECONFIG);
  ASSERT_ERR("--batchnorm is for --model cnn");
  ASSERT_OK(parse(&c, "--open", NULL));
  ASSERT_STREQ(c.precision, "fp32");
  ASSERT_OK(parse(&c, "--open", "--precision", "bf16", NULL));
  ASSERT_STREQ(c.precision, "bf16");
  ASSERT_OK(parse(&c, "--open", "--precision", "fp16", NULL));
  ASSERT_STREQ(c.precision, "fp16");
  expect_flag_error("--precision", "fp8");
  /* Loss scales: auto, dynamic[:S], S; S 2^E or a decimal power of two. */
  ASSERT(c.loss_scale == 0 && !c.loss_scale_fixed);
  for (size_t i = 0; i < sizeof loss_scale_good / sizeof *loss_scale_good;
       i++) {
    ASSERT_OK(parse(&c, "--open", "--loss-scale", loss_scale_good[i].spec,
                    NULL));
    ASSERT_EQ(c.loss_scale_fixed, loss_scale_good[i].fixed);
    if (c.loss_scale != loss_scale_good[i].scale)
      FAIL("--loss-scale %s: %g, want %g", loss_scale_good[i].spec,
           (double)c.loss_scale, (double)loss_scale_good[i].scale);
  }
  for (size_t i = 0; i < sizeof loss_scale_bad / sizeof *loss_scale_bad; i++)
    expect_flag_error("--loss-scale", loss_scale_bad[i]);
  ASSERT_ERR("a power of two");
}

static void test_combination_errors(void) {
  bee_config c;
  ASSERT_RC(parse(&c, NULL), BEE_ECONFIG);
  ASSERT_ERR("--moderator");
  ASSERT_ERR("--open");
  ASSERT_RC(parse(&c, "--open", "--moderator", MOD_HEX, NULL), BEE_ECONFIG);
  ASSERT_ERR("--open and --moderator");
  ASSERT_RC(parse(&c, "--moderator", MOD_HEX, NULL), BEE_ECONFIG);
  ASSERT_ERR("--token");
  ASSERT_RC(parse(&c, "--open", "--token", "t.tok", NULL), BEE_ECONFIG);
  ASSERT_ERR("--token");
  ASSERT_RC(parse(&c, "--open", "--revocations", "r", NULL), BEE_ECONFIG);
  ASSERT_ERR("--revocations");
  ASSERT_OK(parse(&c, "--moderator", MOD_HEX, "--token", "t.tok",
                  "--revocations", "r", NULL));
  /* A moderator from the file and --open from the flags still clash. */
  const char *p = conf("moderator = " MOD_HEX "\ntoken = t\n");
  ASSERT_RC(parse(&c, "--config", p, "--open", NULL), BEE_ECONFIG);
  ASSERT_ERR("--open and --moderator");
}

/* A config line must fail with "PATH:LINE: " + want. */
static void expect_line_error(const char *text, int line, const char *want) {
  bee_config c;
  char where[600];
  const char *p = conf(text);
  snprintf(where, sizeof where, "%s:%d: %s", p, line, want);
  ASSERT_RC(parse(&c, "--open", "--config", p, NULL), BEE_ECONFIG);
  ASSERT_ERR(where);
}

static void test_file_errors(void) {
  bee_config c;
  expect_line_error("swarm = a\nbogus = 1\n", 2, "unknown setting 'bogus'");
  expect_line_error("\n\n# c\nlisten 1.2.3.4:5\n", 4, "expected 'key = value'");
  expect_line_error("join =\n", 1, "join: missing value");
  expect_line_error("join = # none\n", 1, "join: missing value");
  expect_line_error("join = :80\n", 1, "join: bad address");
  expect_line_error("listen = 1.2.3.4\n", 1, "listen: bad address");
  expect_line_error("max-conns = 0\n", 1, "max-conns: bad number");
  expect_line_error("status-interval = ten\n", 1, "status-interval: bad");
  expect_line_error("moderator = abc\n", 1, "moderator: bad public key");
  expect_line_error("swarm = a b\n", 1, "swarm: bad swarm name");
  expect_line_error("log-level = loud\n", 1, "log-level: bad log level");
  expect_line_error("open = yes\n", 1, "open: bad value 'yes'");
  expect_line_error("no-listen = 1\n", 1, "no-listen: bad value");
  expect_line_error("config = other.conf\n", 1, "config: only allowed");
  expect_line_error("help = true\n", 1, "help: only allowed");
  expect_line_error("--open = true\n", 1, "unknown setting '--open'");
  expect_line_error("= 1\n", 1, "unknown setting ''");
  expect_line_error("open = true\r\nswarm = x y\r\n", 2, "swarm: bad");

  /* 65 join lines. */
  char text[BEE_JOIN_MAX * 32 + 64];
  size_t off = 0;
  for (int i = 0; i <= BEE_JOIN_MAX; i++)
    off += (size_t)snprintf(text + off, sizeof text - off,
                            "join = 127.0.0.1:%d\n", 1000 + i);
  expect_line_error(text, BEE_JOIN_MAX + 1, "join: more than 64");

  /* A file that cannot be read: path and strerror, -errno. */
  char path[300];
  snprintf(path, sizeof path, "%s/missing.conf", tmpdir);
  ASSERT_RC(parse(&c, "--open", "--config", path, NULL), -ENOENT);
  ASSERT_ERR(path);
  ASSERT_ERR(strerror(ENOENT));
  ASSERT_RC(parse(&c, "--open", "--config", tmpdir, NULL), -EISDIR);
  ASSERT_ERR(tmpdir);
  ASSERT_RC(parse(&c, "--open", "--config", "", NULL), BEE_ECONFIG);
  ASSERT_ERR("--config");

  /* bee_config_load_file on its own applies over what is there. */
  bee_config_init(&c);
  ASSERT_OK(
      bee_config_load_file(&c, conf("swarm = direct\n"), err, sizeof err));
  ASSERT_STREQ(c.swarm, "direct");
  ASSERT_STREQ(c.listen, "0.0.0.0:45555");
}

static void test_addr_parse(void) {
  char host[BEE_HOST_MAX];
  unsigned port;
  ASSERT_OK(bee_addr_parse("[fe80::1]:443", false, host, sizeof host, &port));
  ASSERT_STREQ(host, "fe80::1");
  ASSERT_EQ(port, 443);
  ASSERT_OK(bee_addr_parse(":0", true, host, sizeof host, &port));
  ASSERT_STREQ(host, "");
  ASSERT_EQ(port, 0);
  ASSERT_OK(
      bee_addr_parse("example.com:65535", false, host, sizeof host, &port));
  ASSERT_STREQ(host, "example.com");
  ASSERT_EQ(port, 65535);
  ASSERT_RC(bee_addr_parse("example.com:1", true, host, sizeof host, &port),
            BEE_ECONFIG);
  ASSERT_RC(bee_addr_parse("1.2.3.4:80", false, host, 4, &port), BEE_ECONFIG);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/test-daemon-config-XXXXXX",
           base && *base ? base : "/tmp");
  ASSERT(mkdtemp(tmpdir) != NULL);

  test_defaults();
  test_every_flag();
  test_training_flags();
  test_systemd_example();
  test_help_version();
  test_file();
  test_crlf();
  test_long_lines();
  test_flag_errors();
  test_combination_errors();
  test_model_flags();
  test_file_errors();
  test_addr_parse();

  const char *names[] = {"beed.conf", "max.conf", "long.conf",
                         "huge.conf", "val.conf", "nul.conf"};
  char path[512];
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
    unlink(path);
  }
  ASSERT_EQ(rmdir(tmpdir), 0);
  return 0;
}
