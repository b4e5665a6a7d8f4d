/* fuzz-avgcodec.c: libFuzzer target for the averager's part decoders.
 *
 * A part comes from a peer: any bytes must decode cleanly or be refused.
 * Input: one byte picks the codec, two bytes the float count n, the rest
 * is the part.  What avg_decode accepts must be finite, avg_decode_add
 * must accept exactly the same parts and add the same values (weight 1
 * onto zeros), and re-encoding the decoded floats must give a part of the
 * same size that decodes again.
 */
#include "averager.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_MAX 9000 /* more than two AVG_B8 blocks */

static float out[N_MAX], acc[N_MAX], again[N_MAX];
static uint8_t enc[4 * N_MAX + 64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3)
    return 0;
  avg_codec c = (avg_codec)(data[0] % (AVG_CODEC_COUNT + 1)); /* one bad */
  size_t n = ((size_t)data[1] << 8 | data[2]) % (N_MAX + 1);
  const uint8_t *part = data + 3;
  size_t len = size - 3;
  int rc = avg_decode(c, part, len, n, out);
  memset(acc, 0, n * sizeof *acc);
  int rc2 = avg_decode_add(c, part, len, n, 1.0f, acc);
  if ((rc == 0) != (rc2 == 0))
    abort();
  if (rc)
    return 0;
  for (size_t i = 0; i < n; i++) {
    bool same = memcmp(&out[i], &acc[i], sizeof out[i]) == 0 ||
                (out[i] == 0 && acc[i] == 0); /* 0 + -0 is +0 */
    if (!isfinite(out[i]) || !same)
      abort();
  }
  size_t elen;
  if (avg_encode(c, out, n, enc, sizeof enc, &elen) != 0 || elen != len ||
      avg_decode(c, enc, elen, n, again) != 0)
    abort();
  return 0;
}
