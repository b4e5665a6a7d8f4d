/* test-trainer-layers.c: what the CUDA backend is handed, checked on the
 * CPU (no GPU needed).
 *
 * - resnet.c's ops as a layer list (trn__resnet_layers), for a CIFAR
 *   ResNet-8 and -20 and ImageNet's ResNet-18: each layer reads earlier
 *   ones (or the input) of exactly the width it takes, a sum reads two
 *   different ones, every output but the last is read, the layers'
 *   parameters tile the flat buffer with no gap or overlap and their
 *   batch-norm buffers tile the buffers, the last layer is the classifier,
 *   and ResNet-18 has torchvision's counts (20 convolutions with batch
 *   norm, 8 residual sums, 3 projection shortcuts, 11,689,512
 *   parameters); a max-pool's output size follows its stride and padding.
 * - gpt's layout (trn__gpt_layout), which cuda-gpt.cu reads the flat
 *   buffer by: contiguous, in trn__gpt_tensors' order, summing to
 *   trn__gpt_nparams.
 * - a layer's output from the last pass (trn__model_layer_out, by which
 *   test-trainer-cuda-model.c finds relus and max-pools that decided
 *   differently on the two backends), on a cnn with batch norm: each relu
 *   is its input's positive part, each max-pool output its window's
 *   largest value at the winner it names, the last layer the logits; bad
 *   calls are -EINVAL, and gpt and resnet have no list.
 */
#include "test.h"
#include "trainer-int.h"

#include <errno.h>

static void check_resnet(const char *label, unsigned depth, unsigned width,
                         unsigned c, unsigned hw, unsigned classes,
                         size_t want_params) {
  trn_model_config cfg;
  trn_model_config_default(&cfg);
  cfg.name = "resnet";
  cfg.depth = depth, cfg.width = width;
  cfg.in_c = c, cfg.in_h = cfg.in_w = hw, cfg.classes = classes;
  trn__resnet *r;
  ASSERT_EQ(trn__resnet_plan(&cfg, &r), 0);
  size_t nl = trn__resnet_layers(r, NULL, 0);
  ASSERT(nl > 3);
  trn__layer *l = calloc(nl, sizeof *l);
  bool *read = calloc(nl, sizeof *read);
  uint8_t *owner = calloc(trn__resnet_nparams(r), 1);
  uint8_t *bufs = calloc(trn__resnet_nbuffers(r) + 1, 1);
  ASSERT(l && read && owner && bufs);
  ASSERT_UEQ(trn__resnet_layers(r, l, nl), nl);
  size_t in = (size_t)c * hw * hw, convs = 0, bns = 0, adds = 0, proj = 0;
  for (size_t i = 0; i < nl; i++) {
    const trn__layer *L = &l[i];
    int srcs[2] = {L->src, L->kind == TRN__L_ADD ? L->src2 : -1};
    for (int k = 0; k < (L->kind == TRN__L_ADD ? 2 : 1); k++) {
      int s = srcs[k];
      ASSERT(s >= -1 && s < (int)i);
      ASSERT_UEQ(s < 0 ? in : l[s].out, L->in);
      if (s >= 0)
        read[s] = true;
    }
    if (L->kind == TRN__L_ADD) {
      ASSERT(L->src2 != L->src);
      ASSERT_UEQ(L->out, L->in);
      adds++;
    }
    if (L->kind == TRN__L_CONV) {
      const trn__conv *cv = &L->cv;
      ASSERT_UEQ((size_t)cv->c * cv->h * cv->w, L->in);
      ASSERT_UEQ((size_t)cv->oc * cv->oh * cv->ow, L->out);
      ASSERT(!L->bias && !cv->relu); /* batch norm follows each */
      ASSERT(i + 1 < nl && l[i + 1].kind == TRN__L_BN &&
             l[i + 1].src == (int)i);
      convs++;
      proj += cv->k == 1;
    }
    if (L->kind == TRN__L_BN) {
      ASSERT_UEQ(L->nparams, 2 * (size_t)L->bn.c);
      ASSERT_UEQ(L->b_off, L->w_off + L->bn.c);
      for (size_t k = 0; k < 2 * (size_t)L->bn.c; k++) {
        ASSERT(L->buf_off + k < trn__resnet_nbuffers(r));
        ASSERT(bufs[L->buf_off + k]++ == 0);
      }
      bns++;
    }
    if (L->kind == TRN__L_POOL) {
      unsigned s = L->s ? L->s : L->k;
      size_t oh = (L->h + 2 * L->pad - L->k) / s + 1;
      ASSERT_UEQ((size_t)L->c * oh * ((L->w + 2 * L->pad - L->k) / s + 1),
                 L->out);
      ASSERT_EQ(L->k, 3);
      ASSERT_EQ(s, 2);
      ASSERT_EQ(L->pad, 1);
    }
    if (L->kind == TRN__L_AVGPOOL)
      ASSERT_UEQ(L->out, L->c);
    for (size_t k = 0; k < L->nparams; k++) {
      ASSERT(L->w_off + k < trn__resnet_nparams(r));
      ASSERT(owner[L->w_off + k]++ == 0);
    }
  }
  for (size_t i = 0; i + 1 < nl; i++)
    if (!read[i])
      FAIL("%s: layer %zu's output is read by no layer", label, i);
  for (size_t k = 0; k < trn__resnet_nparams(r); k++)
    ASSERT(owner[k] == 1);
  for (size_t k = 0; k < trn__resnet_nbuffers(r); k++)
    ASSERT(bufs[k] == 1);
  ASSERT_EQ(l[nl - 1].kind, TRN__L_LINEAR);
  ASSERT(l[nl - 1].bias);
  ASSERT_UEQ(l[nl - 1].out, classes);
  ASSERT_EQ(l[nl - 2].kind, TRN__L_AVGPOOL);
  ASSERT_UEQ(convs, bns);
  if (want_params)
    ASSERT_UEQ(trn__resnet_nparams(r), want_params);
  if (depth == 18) {
    ASSERT_UEQ(convs, 20);
    ASSERT_UEQ(adds, 8);
    ASSERT_UEQ(proj, 3);
  }
  printf("%s: %zu layers, %zu convolutions, %zu sums (%zu projections), "
         "%zu parameters\n",
         label, nl, convs, adds, proj, trn__resnet_nparams(r));
  free(l);
  free(read);
  free(owner);
  free(bufs);
  trn__resnet_free(r);
}

static void check_gpt(void) {
  trn_model_config cfg;
  trn_model_config_default(&cfg);
  cfg.name = "gpt";
  cfg.vocab = 300, cfg.ctx = 48, cfg.layers = 3, cfg.heads = 4, cfg.embd = 64;
  size_t off[TRN__GPT_TENSORS], size[TRN__GPT_TENSORS];
  trn__gpt_layout(&cfg, off, size);
  trn__gpt *g;
  ASSERT_EQ(trn__gpt_plan(&cfg, &g), 0);
  size_t ends[TRN__GPT_TENSORS];
  ASSERT_UEQ(trn__gpt_tensors(g, ends, TRN__GPT_TENSORS), TRN__GPT_TENSORS);
  size_t at = 0, C = cfg.embd, L = cfg.layers;
  for (int t = 0; t < TRN__GPT_TENSORS; t++) {
    ASSERT_UEQ(off[t], at);
    at += size[t];
    ASSERT_UEQ(ends[t], at);
  }
  ASSERT_UEQ(at, trn__gpt_nparams(&cfg));
  ASSERT_UEQ(size[TRN__GPT_WTE], (size_t)cfg.vocab * C);
  ASSERT_UEQ(size[TRN__GPT_WPE], (size_t)cfg.ctx * C);
  ASSERT_UEQ(size[TRN__GPT_QKVW], L * 3 * C * C);
  ASSERT_UEQ(size[TRN__GPT_FCPW], L * 4 * C * C);
  ASSERT_UEQ(size[TRN__GPT_LNFB], C);
  printf("gpt: %d tensors, %zu parameters, contiguous\n", TRN__GPT_TENSORS,
         at);
  trn__gpt_free(g);
}

/* cnn with batch norm on 1x12x12, a training pass of 3: the layers'
 * outputs against each other. */
static void check_layer_out(void) {
  trn_model_config cfg;
  trn_model_config_default(&cfg);
  cfg.name = "cnn", cfg.batchnorm = true;
  cfg.in_h = cfg.in_w = 12, cfg.conv[0] = 4, cfg.conv[1] = 6, cfg.dense = 16;
  cfg.max_batch = 5;
  trn_model *m;
  char err[256];
  ASSERT_EQ(trn_model_new(&cfg, &m, err, sizeof err), 0);
  enum { B = 3 };
  float x[B * 144];
  int32_t y[B] = {1, 7, 3};
  for (size_t i = 0; i < B * 144; i++)
    x[i] = (float)((i * 37 + 11) % 101) / 50.0f - 1.0f;
  ASSERT_EQ(trn_model_train_batch(m, x, y, B, NULL), 0);
  size_t nl;
  const trn__layer *l = trn__model_layers(m, &nl);
  static const int kinds[] = {TRN__L_CONV,    TRN__L_BN,   TRN__L_RELU,
                              TRN__L_POOL,    TRN__L_CONV, TRN__L_BN,
                              TRN__L_RELU,    TRN__L_POOL, TRN__L_LINEAR,
                              TRN__L_RELU,    TRN__L_DROPOUT,
                              TRN__L_LINEAR};
  ASSERT_UEQ(nl, sizeof kinds / sizeof *kinds);
  float *out[sizeof kinds / sizeof *kinds];
  size_t positive = 0, pooled = 0;
  for (size_t i = 0; i < nl; i++) {
    ASSERT_EQ(l[i].kind, kinds[i]);
    out[i] = malloc(B * l[i].out * sizeof **out);
    ASSERT(out[i] != NULL);
    uint32_t *arg = NULL;
    if (l[i].kind == TRN__L_POOL)
      ASSERT((arg = malloc(B * l[i].out * sizeof *arg)) != NULL);
    ASSERT_EQ(trn__model_layer_out(m, i, B, out[i], arg), 0);
    if (l[i].kind == TRN__L_RELU)
      for (size_t j = 0; j < B * l[i].out; j++) {
        float v = out[i - 1][j];
        ASSERT(out[i][j] == (v > 0 ? v : 0));
        positive += v > 0;
      }
    if (arg) { /* 2x2 windows of the (c, h, w) planes before */
      const trn__layer *L = &l[i];
      unsigned ow = L->w / 2, oh = L->h / 2;
      for (size_t j = 0; j < B * L->out; j++) {
        size_t plane = j / ((size_t)oh * ow), r = j % ((size_t)oh * ow);
        const float *in = out[i - 1] + plane * L->h * L->w;
        unsigned y0 = (unsigned)(r / ow) * 2, x0 = (unsigned)(r % ow) * 2;
        ASSERT(arg[j] / L->w - y0 < 2 && arg[j] % L->w - x0 < 2);
        ASSERT(out[i][j] == in[arg[j]]);
        for (unsigned a = 0; a < 2; a++)
          for (unsigned b = 0; b < 2; b++)
            ASSERT(in[(y0 + a) * L->w + x0 + b] <= out[i][j]);
        pooled++;
      }
      free(arg);
    }
  }
  ASSERT(positive > 0 && pooled > 0);
  ASSERT(memcmp(out[nl - 1], trn_model_logits(m),
                B * l[nl - 1].out * sizeof(float)) == 0);
  uint32_t w[8];
  ASSERT_EQ(trn__model_layer_out(m, nl, B, out[0], NULL), -EINVAL);
  ASSERT_EQ(trn__model_layer_out(m, 0, 6, out[0], NULL), -EINVAL);
  ASSERT_EQ(trn__model_layer_out(m, 2, 1, out[0], w), -EINVAL); /* a relu */
  for (size_t i = 0; i < nl; i++)
    free(out[i]);
  trn_model_free(m);
  static const char *const others[] = {"gpt", "resnet"};
  for (int i = 0; i < 2; i++) {
    trn_model_config_default(&cfg);
    cfg.name = others[i];
    if (i)
      cfg.depth = 8, cfg.width = 4, cfg.in_c = 3, cfg.in_h = cfg.in_w = 16;
    cfg.max_batch = 2;
    ASSERT_EQ(trn_model_new(&cfg, &m, err, sizeof err), 0);
    ASSERT(trn__model_layers(m, &nl) == NULL && nl == 0);
    float v[4];
    ASSERT_EQ(trn__model_layer_out(m, 0, 1, v, NULL), -EINVAL);
    trn_model_free(m);
  }
  printf("layer outputs: %zu layers, %zu relu inputs above 0, %zu pooled\n",
         sizeof kinds / sizeof *kinds, positive, pooled);
}

int main(void) {
  check_resnet("resnet-8, width 4, 3x16x16", 8, 4, 3, 16, 10, 0);
  check_resnet("resnet-20, width 16, 1x28x28", 20, 16, 1, 28, 10, 0);
  check_resnet("resnet-18, width 64, 3x224x224", 18, 64, 3, 224, 1000,
               11689512);
  trn_model_config cfg;
  trn_model_config_default(&cfg);
  cfg.name = "resnet", cfg.depth = 110;
  trn__resnet *r;
  ASSERT_EQ(trn__resnet_plan(&cfg, &r), -E2BIG); /* past the op list */
  check_gpt();
  check_layer_out();
  return 0;
}
