"""zmuon.newton_schulz on the CPU of a fixed [2, 48, 80] input (exact small fractions, no random
generator, so that any numpy gives the same input), printed as JSON: what wheel_check.sh compares
between the build tree's library and the installed wheel's."""
import json

import numpy as np

import zmuon

i = np.arange(2 * 48 * 80, dtype=np.int64).reshape(2, 48, 80)
x = (((i * 37 + (i // 80) * 11) % 23) - 11).astype(np.float32) / 8.0
o = zmuon.newton_schulz(x)
print(json.dumps([float(v) for v in o.ravel()]))
