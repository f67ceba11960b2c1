"""A classical lossless codec for uint8 planes [C, H, W]: seeds bits-back chains, codes alpha.

No latents and no bits-back, so it needs no initial bits. Design (CALIC / JPEG-XL style,
vectorized):

* Order: anti-diagonal wavefronts t = x + 2y. Every pixel of a wavefront has its causal
  neighbours N, W, NW, NE, WW, NN in earlier wavefronts, so a wavefront is decoded in one
  vectorized step (W + 2H steps per channel) and still sees its left neighbour. Within a
  wavefront, channels go in order, so channel c also sees channels < c at the same pixel.
* Prediction: 7 fixed linear sub-predictors, plus for c > 0 each of them moved by the
  gradient of every earlier channel (p + x_r - p_r). They are blended with weights
  1 / (1 + their summed error at the six causal neighbours)**2, so the blend follows whichever
  sub-predictor works locally (edges, smooth areas, inter-channel correlation).
* Context: 16 bins of the activity log2 of the blend's error at N, W, NW, NE (plus, for c > 0,
  the error of channel c-1 at this pixel).
* Coding: per channel and bin an adaptive histogram of residuals x - round(pred) (integer counts,
  a calibrated two-sided geometric prior worth 128 pixels, +1 pixel per coded pixel). The pixel
  is coded as a categorical over 0..255: the histogram window around the prediction.
* A constant plane costs one flag and its value.

Version 2 (VERSIONS; the stream header's `seed` setting, 1 where absent) adds, on the same
predictions:
* Channel order G, R, B (then alpha): green carries the most of the luminance, so it is the best
  reference for the gradient transfer to the others.
* Bins from the errors at N, W (weight 2), NW, NE, WW, NN.
* Bias cancellation (CALIC): per (bin, texture) context, the running mean of the blend's error
  (sum and count, halved at BIAS_HALVE, shrunk toward 0 by BIAS_SHRINK) corrects the prediction.
  Texture: the signs of N, W, NW, NE, WW, NN minus the prediction and, for c > 0, of the previous
  channel's error at this pixel. Errors beyond BIAS_MAX_ERR (edges) stay out of it: with them in,
  two-level images (masks, text) cost 60% more than in version 1.
* Sub-pixel symmetry: the corrected prediction p + f/8 is coded around the nearest integer, and
  where that lies above it (f >= 4) the residual is mirrored, so one histogram per bin learns the
  skew toward the prediction's fractional part.
* An eighth sub-predictor, where it pays (one flag per image: the encoder codes both ways and
  keeps the smaller): local least squares (GLICBAWLS-style) on the 36 causal pixels within 4 rows
  and columns, from the six neighbours, the earlier channels at the pixel and a constant. Its normal
  equations are exact integers (float32 matmul, sums < 2**24), its solve element-wise IEEE
  arithmetic: the same bits on every machine. It gains on photographs and loses on two-level
  images (sparse dots: +85%), hence the flag.
Measured against version 1 (ideal codelengths, 2-core CPU): Kodak 01, 03, 05, 13, 20, 23 whole
2.925 against 3.007 bits/dim (without least squares 2.967), the first 100 CIFAR-10 test images
3.865 against 3.916, 256x256 crops of the 12 misc images 3.773 against 3.904; synthetic two-level
images (a disc, stripes, sparse dots) 3% to 6% larger. A 768x512 image takes about 8 s to encode
(both ways) and 9 - 13 s to decode, against 2 - 3 s for version 1.

Version 3 adds, per channel after the first (one flag each; the encoder codes the channel both
ways and keeps the smaller), a difference mode: the channel minus the first (green) is predicted by
LOCO-I's median edge detector on that difference plane, and coded with adaptive histograms per
context: activity (3 levels of the mode's own residuals at N, W, NW, NE) x the difference plane's
gradients N-NW, W-NW, NE-N clipped to +-3 x the pixel's row and column parity x (blue) the sign
of red's residual in this mode at the pixel: green's noise enters both differences with the same
sign (N_DIFF_CTX = 12348 rows, a light prior worth 16 pixels each). Where red or blue minus green
is smooth, as in photographs whose colour was stored at lower resolution (Kodak's PhotoCD chroma),
this beats the blend by far: JPEG-XL codes kodim16's red-minus-green plane alone in 1.71
bits/pixel, version 2 its red channel in 2.09 and this mode in about 1.62; version 2 was as good as
JPEG-XL on green alone (3.93 against 3.94). The blend's state is still computed for a channel in
this mode (later channels read it), so each channel's choice is independent.
Measured (2-core CPU, every file decoded): the 24 Kodak images whole 2.824 bits/dim against 2.950
for version 2 and 2.885 for JPEG-XL at effort 9 (below it on 22 of the 24); the first 100 CIFAR-10
test images 3.894 against 3.900. Encode 10 s and decode 10 s per Kodak image, as version 2.

Version 4 changes the difference mode (same flags, same fine rows):
* Blue (channel 2) is predicted and coded against (green + red) // 2 instead of green: the MED
  prediction and the context's gradients on the plane x_2 - (x_0 + x_1) // 2 (pixel values, known
  at this point of the wavefront whatever red's mode). Red and alpha stay against green; red's
  residual sign in the mode stays in blue's context. Blue in this mode, bits/pixel (encoder's
  codelengths): kodim16 1.910 -> 1.844, kodim12 1.905 -> 1.821, kodim05 2.792 -> 2.708 (the
  blend still wins there, 2.596); the 24 Kodak images 2.8235 -> 2.8126 bits/dim.
* Each pixel is coded with its row's counts (prior DIFF_PRIOR_MASS_4 = 512, half version 3's) plus
  those of a coarse row (activity level x the gradients clipped to +-2 x parity: N_DIFF_COARSE =
  1500 rows, prior 1024) scaled to DIFF_MIX = 4096 in total by integer floor division. The 12348
  fine rows learn slowly (splitting red's rows three ways by a context bit that carries nothing,
  green's residual sign, cost 0.015 bpd); the coarse rows learn fast and the fine ones sharpen
  them where they have seen enough. The 24 Kodak images 2.8126 -> 2.7880 bits/dim (encoder's
  codelengths).
Tried and dropped (8 Kodak images, 01 03 05 09 12 14 16 20, encoder's codelengths against the
first change alone): the sign of green's blend residual at the pixel in red's context +0.015
bpd, in red's and blue's +0.046; no parity in the fine rows +0.018, gradients clipped to +-2
+0.005; coarse rows of activity x parity x sign -0.007, gradients +-1 -0.015 (+-2: -0.023, kept).
For green (version 3 is only level with JPEG-XL there), finer histogram rows mixed the same way
with the activity bin's: the bias context's 6 texture bits +0.066 bits per green pixel, 4 of them
+0.028, an edge direction (3 levels, 2 images) +0.008 (the bias correction already conditions
on those texture bits).
Measured (bench, every file decoded, one thread, the machine's other core busy): the 24 Kodak
images 2.788 bits/dim against 2.824 for version 3 and 2.885 for JPEG-XL at effort 9 (below it on
all 24; version 3 on 22), smaller than version 3 on 23 of them (kodim20 the same size: its red
and blue stay in the blend mode); the first 100 CIFAR-10 test images 3.893 against 3.894 (4 files
smaller, none larger). Encode 8.3 s and decode 7.8 s per Kodak image against 6.8 s and 6.7 s for
version 3 in the same run.

Version 5 adds, on top of version 4 and for all planes of a call at once, an LZMA mode (one flag,
coded first): the planes' bytes interleaved per pixel (H, W, C), compressed with raw LZMA2
(preset 9e, lc 4, pb 0, the dictionary the next power of two of the byte count, 4 KiB - 64 MiB;
the decoder derives it from the shape), pushed as uniform bytes after their count. The encoder
takes it where it is smaller than version 4's coding: on graphics, screenshots and palette index
planes, whose long exact repeats no predictive model captures. Measured (encoder's sizes): a
480x320 screenshot-like picture (text, flat shapes) 1.858 -> 0.289 bits/pixel (PNG 1.175, WebP
0.259); Kodak images made 256-colour palettes (Pillow's adaptive palette), their index planes:
kodim03 3.959 -> 2.893, kodim12 4.773 -> 3.755 bits/pixel. Photographs keep version 4's coding
(LZMA of kodim01's RGB is about 6 bits/dim). The compressed bytes decode the same everywhere (the
LZMA format is fixed); only an encoder's choice of them may differ between liblzma builds, and the
file carries the bytes.
Version 6 changes the blend mode's least squares and histograms (the difference mode and the LZMA
mode stay version 5's):
* The least-squares sub-predictor trains on a radius-5 window (54 pixels, not 36) and has four more
  neighbours as features: NNE, NWW, NNW, NNEE (LS_EXTRA; all in earlier wavefronts).
* The least-squares flag becomes a mode, one of three (log2 3 bits): off, on, or on with its
  sub-predictions (its own and the transferred ones) weighed LS_BOOST = 3 times in the blend. The
  encoder codes all three and keeps the smallest; the boosted mode reuses the least-squares
  predictions of the plain one (they depend on the pixels only), so it costs a blend, not a solve.
  On photographs the boost wins nearly always; on CIFAR-10 thumbnails it loses (with it in place of
  the plain mode, 53 of the first 100 test images fall back to no least squares, +0.016 bits/dim),
  hence the choice.
* A blend-mode histogram row halves (rounding up) once it holds more than 8192 pixels' counts
  (HIST_HALVE), so the counts follow the image. The pusher, which rewinds the counts from the last
  wavefront to the first, logs each halving and restores the row from it.
Measured (encoder's codelengths, the AVX-512 2-core EPYC, one thread), Kodak 01 03 05 09 12 14 16 20
against version 5: 2.6316 -> 2.6201 bits/dim (-0.44%; the window and features -0.13%, the halving
-0.09%, the boosted mode -0.22%), each of the 8 smaller. Tried and dropped on those images:
against version 5, halving at 1,024 pixels +0.0053 bits/dim (4,096: -0.0018, 8,192: -0.0023, kept,
16,384: -0.0018), 24 activity bins instead of 16 -0.0004 (+0.0001 with the halving), the
sub-predictors' spread added to the activity +0.005 to +0.012, blend weights 1/err**3 +0.002, a
window of radius 5 or 6 on the old features +0.0002 / +0.0007; against four more features at
radius 4, two more only (NNE, NWW) +0.0005; against the four at radius 5, radius 6 -0.0001 (and
slower); against the
window, features and halving, a ridge of 64 +0.0005 or 1,024 +0.005, distance-weighted samples
-0.0001, the difference mode's rows halving too within +-0.0008 per image (4 images); against a
boost of 3 on every image, 2 +0.0003, 4 +0.0011, 8 +0.0076, 2 on the own sub-prediction only
+0.0001, the boost only where the window lies inside the image (CIFAR-10: still +0.008).
Version 7 adds a third mode for each channel after the first (one of three in the stream: the blend,
the difference mode, or the two mixed), and the difference mode's fine rows halve past HIST_HALVE as
the blend's do. The mixed mode codes each pixel with the mixture of the two modes' distributions
(both sets of counts learn from every pixel): the blend weighs w / 64, from how the two did on the
36 pixels of earlier wavefronts within 4 rows and columns, w = 64 / (1 + 2**(0.2 (B - D))) with B
and D the sums of their codelengths there (1/64 bit, from an integer logarithm; w rounded, from 1 to
63). Where the chroma is smooth the difference mode takes over, where it is textured the blend,
pixel by pixel instead of once per channel; and where both are unsure the mixture hedges. The
mixture's counts are exact integers, w T_b S_d + (64 - w) T_d S_b (S: each table's sum, below 2**23
with the halving; planes wider than MIX_MAX_WIDTH, 65,536 pixels, never mix). Measured before
building it (encoder's codelengths from version 6's per-pixel bits, the 2-core Intel Xeon): the 24
Kodak images 2.7770 -> 2.7265 bits/dim (-1.8%, each image smaller, -0.016 to -0.092); the weights
from 4 or 8 neighbours -0.026 / -0.032 on 7 images where the 36 give -0.041 (radius 5's 54: -0.042),
sharpness 0.15 - 0.3 within 0.0025, weights in 1/16 or 1/256 within 0.0005; weights from summed
absolute errors instead of codelengths lose (+0.010 against the per-channel choice); mixing the
three least-squares options' blends as well -0.002 (not worth computing three blends in the
decoder). The first 100 CIFAR-10 test images: 3.8569 -> 3.8526 (ideal codelengths). Measured, the
files (`sfcodec compress --fallback seed`, every one decoded): the 24 Kodak images 2.727 bits/dim
against 2.778 for version 6, each smaller; decoding one takes about 11 s instead of 7 - 8 s (two
sets of tables for red and blue; docs/RESULTS.md, 0.9.23).
Version 8 adds error feedback to the blend (_Cascade; no new flag, every channel's blend): after the
bias correction the prediction moves by a linear function of the blend's own errors at N, W, NW, NE,
WW and NN, with weights per (channel, bin) that a normalized LMS learns as the pixels come (integer
weights in 1/2**20, step 2**-8, clipped to +-2). Where the blend errs alike at neighbouring pixels
(texture that none of its sub-predictors follows, its shared blind spots), the weights learn it.
Measured before building it (float simulations on Kodak 01 05 12 20): the best fixed weights per bin
for the whole image (least squares, not causal) cut green's mean |error| by 2.5 - 4.2% and its bits by
0.033 bits/pixel (3.957 -> 3.925); the online NLMS, wavefront by wavefront, by 0.028. On all three
channels and every mode (encoder's codelengths of the float simulation, those four images) every
variant gave -0.65% to -0.72% (a step of 0.02: -0.53%): steps 0.0025 - 0.01, the errors after the
feedback or the blend's as features, the previous channel's error at the pixel as a seventh one, the
four least-squares neighbours NNE, NWW, NNW, NNEE as four more, the steps of a wavefront averaged
instead of summed; the simplest is kept. Encoder's codelengths of this integer version against
version 7 (the 2-core Intel Xeon), Kodak 01 03 05 09 12 14 16 20: 2.5735 -> 2.5550 bits/dim (-0.72%,
each image smaller: -0.57% to -0.89%); steps 2**-7 and 2**-9: 2.5555 and 2.5554. The first 100 CIFAR-10
test images: 3.8526 -> 3.8441 (-0.22%; 11 of them larger: the weights start at 0 and learn from the image).
Measured against version 8 and not built (2026-12-07, the 2-core AMD EPYC with AVX2, encoder's
codelengths; version 8 itself gave 2.5550 on the 8 Kodak images above, as on the Xeon): the whole
encoder's choice (every least-squares mode, the difference and mixed modes) on Kodak 01 03 05 09 12
14 16 20, with two more linear sub-predictors (N + W) / 2 and (N + NE) / 2: -0.0018 bits/dim (7 of 8
smaller); with a ninth one instead, a least-squares predictor fitted to the whole plane (22 causal
pixels within 3 rows and columns, the earlier channels at the pixel and at its N, W, NW, NE; its
coefficients would ride in the stream; measured with the plane's edge replicated, which a decoder
lacks in the first rows): -0.0016; both: -0.0030 (-0.12%). In the blend mode alone the two averages
gain 0.009 - 0.023 bits/pixel on red and blue (kodim01, 05, 12, 20), of which little is left where
the difference and mixed modes code those planes. MED or Paeth as sub-predictors: green within
+-0.007, red and blue up to +0.03 (Paeth). Blend-mode bits of kodim01 (green, red, blue: 5.004,
2.381, 2.163), each mixed per pixel as version 7 mixes (weights from the codelengths of the 36
neighbours) with a second set of histograms: rows that halve at 1,024 pixels 5.009, 2.383, 2.167;
rows by the bias context's six texture bits x 8 activity levels 5.008, 2.393, 2.170. Residual counts
spread over neighbouring slots (8, 16, 16, 16, 8 instead of 64, in rows of bin 9 and up; kodim01,
20): green -0.007 / -0.005, red +0.012 / +0.002; in every row (16, 32, 16) up to +0.27. None of
these gains 0.15%; none was worth a format version.
The encoder's effort (0.10.3, `sfcodec compress --effort`; no new version: the decoder reads the modes
from the stream): how many modes it tries. 3 (the default) every one; 2 no least-squares predictor, whose
per-pixel solve is about a third of the decoder's time; 1 nor the mixed mode, whose two sets of tables
are most of the rest. Measured (`python bench/seed_effort.py kodak`, the files api.compress writes, every
one decoded; 2026-12-07, the 2-core AMD EPYC with AVX2, one process, nothing else running), the 24 Kodak
images: effort 3 2.7077 bits/dim, encode 23.1 s and decode 17.0 s an image; effort 2 2.7290 (+0.79%,
+0.17% to +2.28% per image), 11.4 s and 10.2 s; effort 1 2.7823 (+2.76%, +0.92% to +4.90%), 9.4 s and
6.0 s. Every effort's file is below JPEG-XL at effort 9 on all 24 (effort 1's closest: -0.44%).
The decoder's companion (0.10.4; no new version, the same pixels from the same files): what the
decoder needs of a channel in a wavefront that reads earlier wavefronts only (the least-squares fits,
the blend's weights, the mixed mode's weights: _Ahead) is made a step ahead by a second process, forked
with the state's tables in shared memory (_Companion), while this one does everything else. On two
cores kodim01 decodes in about 11 s instead of 16 at effort 3 (RESULTS.md, 0.10.4).
The encoder's two processes (0.10.5; the same files): the analysis's second process (0.9.27) first makes
the last plane's least-squares sub-predictions (_ls_own), then the option without least squares and the
difference mode's plans, while this one makes the options with least squares; and the pusher rewinds
the counts the analysis ran (_Plan.run) instead of running them again (RESULTS.md, 0.10.5).
Everything that parametrizes the coder is integer arithmetic, and the categorical tables hold
integer counts (sums stay exact in float64), so encoder and decoder agree on any platform.
Decoding garbage never raises (every pop yields a valid byte); the caller's pixel CRC catches it.

Version 1, measured (2 shared CPU cores): 3.92 bpd on the first 100 CIFAR-10 test images (PNG
5.88), Kodak 01/05/13/23: 3.27/3.44/3.82/2.72 bpd (PNG 5.28/5.47/6.03/3.78); about 0.2 Mpix/s to
encode and 0.15 (Kodak) to 0.07 (32x32, per-wavefront overhead) Mpix/s to decode.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import lzma
import math
import types
from typing import NamedTuple

import constriction
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import workers
from .ans import Codec, Message
from .distributions import _pop, _push, uniform

_CATEGORICAL = constriction.stream.model.Categorical(perfect=False)
_FLAG, _BYTE = uniform(2, ()), uniform(256, ())  # a plane's constant flag and value

N_BINS = 16
FRAC = 8  # predictions are in units of 1/8 pixel
PRIOR_MASS = 8192  # total prior count per histogram (= 128 pixels' worth)
INC = 64  # count added per coded pixel
FILL = 128  # value of the missing neighbours of the first pixel
_WEIGHT_ONE = 1 << 40
_CHUNK = 8192
VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)
LATEST = 8
BIAS_SHRINK = 8   # version 2: the bias is sum / (count + this): a few pixels do not move it far
BIAS_HALVE = 128  # version 2: counts halve here, so the bias follows the image
BIAS_MAX_ERR = 40  # version 2: errors beyond 5 pixel values (edges) stay out of the bias
_N_TEX = 7        # version 2: texture bits of the bias context
LS_RADIUS = 4     # version 2: the least-squares predictor's window
LS_RIDGE = 1.0    # version 2: its ridge (the normal equations' entries are ~10^5 - 10^6)
LS_RADIUS_6 = 5   # version 6: the least-squares window, and four more neighbours as its features:
LS_EXTRA = ((-2, 1), (-1, -2), (-2, -1), (-2, 2))  # (dy, dx) of NNE, NWW, NNW, NNEE (N where missing)
HIST_HALVE = 8192 * INC  # version 6: a blend histogram row halves past 8192 pixels' counts
LS_BOOST = 3      # version 6: the blend weighs the least-squares sub-predictions 3x
# Version 7's mixed mode (channels after the first): per pixel the blend's and the difference mode's
# distributions mixed, the blend weighing w / 2**MIX_K, w from how the two did on the pixels of
# MIX_WINDOW (_mix_weight): u = (sum there of the blend's codelength minus the difference mode's,
# in 1/64 bit) // MIX_DIV, clipped to +-MIX_U, w = round(2**MIX_K / (1 + 2**(u / 16))): the weights
# follow 2**(-0.2 x each mode's bits over the window).
MIX_K = 6
MIX_DIV = 20
MIX_U = 16 * (MIX_K + 3)
MIX_RADIUS = 4       # MIX_WINDOW: the 36 pixels of earlier wavefronts within 4 rows and columns
MIX_MAX_WIDTH = 1 << 16  # wider planes never mix: the mixed counts' sums could pass 2**53 (_mix_tables)
# Version 8's error feedback (_Cascade): the blend's corrected prediction plus a linear function of
# the blend's errors at the causal neighbours, its weights per (channel, bin) in 1/2**CASCADE_SHIFT
# learnt by a normalized LMS of step 2**-CASCADE_RATE, each kept within +-CASCADE_MAX.
CASCADE_SHIFT = 20
CASCADE_RATE = 8
CASCADE_MAX = 2 << CASCADE_SHIFT
# Version 3's difference mode (channels after the first): contexts = activity level (the sum of
# |residual| at N, W, NW, NE below DIFF_ACT[0], below DIFF_ACT[1], or not) x the difference
# plane's gradients N-NW, W-NW, NE-N clipped to +-DIFF_GRAD x the pixel's row and column parity
# x the sign of the previous channel's difference-mode residual at the pixel (channels c >= 2).
DIFF_ACT = (3, 11)
DIFF_GRAD = 3
_DIFF_G = 2 * DIFF_GRAD + 1
N_DIFF_CTX = (len(DIFF_ACT) + 1) * _DIFF_G ** 3 * 4 * 3
assert N_DIFF_CTX < 2 ** 15  # _Plan.compact keeps rows in int16
DIFF_PRIOR_MASS = 1024  # 16 pixels' worth: the contexts are many, each must learn fast
DIFF_THETA = (19661, 32768, 45875)  # prior theta * 2**16 per activity level (0.3, 0.5, 0.7)
# Version 4's difference mode codes each pixel with the counts of its row above (a lighter prior,
# DIFF_PRIOR_MASS_4) plus those of a coarse row, scaled to DIFF_MIX in total: activity level x the
# gradients clipped to +-DIFF_COARSE_GRAD x parity. The coarse rows learn fast, the fine ones
# sharpen them where they have seen enough.
DIFF_COARSE_GRAD = 2
N_DIFF_COARSE = (len(DIFF_ACT) + 1) * (2 * DIFF_COARSE_GRAD + 1) ** 3 * 4
DIFF_MIX = 4096
DIFF_PRIOR_MASS_4 = 512

# Per-bin prior: two-sided geometric theta**|r| with theta = THETA / 2**16; row 0 for the first
# channel, row 1 for channels predicted from earlier ones. From `calibrate` on the first 400
# CIFAR-10 training images (mean |residual| s per bin, theta = exp(-1/s)).
THETA = np.array(
    [
        [7278, 19984, 20209, 25124, 35065, 42492, 48287, 52314,
         55520, 57852, 59515, 60752, 61708, 62353, 62888, 63379],
        [83, 189, 4554, 11652, 19242, 27385, 34677, 40781,
         45783, 49860, 53216, 56132, 58465, 60193, 60179, 62901],
    ],
    dtype=np.int64,
)


def _check_shape(shape: tuple[int, int, int]) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise ValueError(f"seed codec: expected a shape [C, H, W], got {shape}")
    c, h, w = (int(s) for s in shape)
    if not (1 <= c <= 4 and h >= 1 and w >= 1):
        raise ValueError(f"seed codec: need 1 <= C <= 4 and H, W >= 1, got {shape}")
    return c, h, w


@functools.lru_cache(maxsize=8)
def _layout(h: int, w: int) -> "_Layout":
    return _Layout(h, w)


class _Layout:
    """Per image size: causal neighbour indices and the wavefronts. Index h*w is 'no pixel'.
    Indices are int32 (images have fewer than 2**31 pixels): half the memory of int64."""

    def __init__(self, h: int, w: int):
        self.h, self.w, self.n = h, w, h * w
        y, x = np.indices((h, w), dtype=np.int32)
        at = lambda yy, xx: yy * w + xx
        none = self.n
        # Missing neighbours fall back to the nearest causal one, so edges predict sensibly.
        w_ = np.where(x > 0, at(y, x - 1), none)
        n_ = np.where(y > 0, at(y - 1, x), w_)
        w_ = np.where(x > 0, w_, n_)
        nw = np.where((y > 0) & (x > 0), at(y - 1, x - 1), np.where(y > 0, n_, w_))
        ne = np.where((y > 0) & (x < w - 1), at(y - 1, np.minimum(x + 1, w - 1)), n_)
        ww = np.where(x > 1, at(y, x - 2), w_)
        nn = np.where(y > 1, at(y - 2, x), n_)
        self.nbr = np.stack([n_, w_, nw, ne, ww, nn]).reshape(6, -1)  # N, W, NW, NE, WW, NN
        t = (x + 2 * y).ravel()
        order = np.argsort(t, kind="stable").astype(np.int32)
        self.steps = np.split(order, np.cumsum(np.bincount(t))[:-1])

    @functools.cached_property
    def extra(self) -> np.ndarray:
        """[4, n] int32: version 6's least-squares neighbours LS_EXTRA (NNE, NWW, NNW, NNEE) of every
        pixel, N where one lies outside the image; made once per layout, not per call (0.9.21)."""
        j = np.arange(self.n, dtype=np.int64)
        y, x = np.divmod(j, self.w)
        out = np.empty((len(LS_EXTRA), self.n), dtype=np.int32)
        for k, (dy, dx) in enumerate(LS_EXTRA):
            inside = (y + dy >= 0) & (x + dx >= 0) & (x + dx < self.w)
            out[k] = np.where(inside, j + dy * self.w + dx, self.nbr[0])
        return out


# The 7 sub-predictors as integer combinations of (N, W, NW, NE, WW, NN), in 1/8 pixel:
# N, W, W+N-NW, W+NE-N, N+(N-NN)/2, W+(W-WW)/2, (3W+2N-2NW+NE)/4.
_SUB = np.array(
    [
        [8, 0, 8, -8, 12, 0, 4],
        [0, 8, 8, 8, 0, 12, 6],
        [0, 0, -8, 0, 0, 0, -4],
        [0, 0, 0, 8, 0, 0, 2],
        [0, 0, 0, 0, 0, -4, 0],
        [0, 0, 0, 0, -4, 0, 0],
    ],
    dtype=np.int64,
)


def _subpredictors(v: np.ndarray) -> np.ndarray:
    """[6, n] neighbour values -> [n, 7] predictions in 1/8 pixel (exact integer matmul)."""
    return v.T @ _SUB


def _ls_offsets(radius: int) -> np.ndarray:
    """[K, 2] (dy, dx) of the pixels a local least-squares fit trains on: up to `radius` back on
    the same row, and on the `radius` rows above from dx = -radius to min(2 dy' - 1, radius), dy'
    rows up: exactly the pixels of earlier wavefronts (dx + 2 dy < 0) within the window."""
    offs = [(0, -k) for k in range(1, radius + 1)]
    for k in range(1, radius + 1):
        offs += [(-k, dx) for dx in range(-radius, min(2 * k - 1, radius) + 1)]
    return np.array(offs, dtype=np.int64)


_LS_OFFSETS = {2: _ls_offsets(LS_RADIUS), 6: _ls_offsets(LS_RADIUS_6)}  # by the version that set them
_LS_MAX_SUM = max(len(o) for o in _LS_OFFSETS.values()) * 255 * 255
assert _LS_MAX_SUM < 2 ** 24  # the normal equations stay exact in float32


def _ls_window(version: int) -> np.ndarray:
    """The least-squares predictor's training offsets in a version (2 - 5: radius 4; 6: radius 5)."""
    return _LS_OFFSETS[6 if version >= 6 else 2]


def _ls_dims(c: int, version: int) -> int:
    """The number of least-squares features of channel c: six neighbours (ten from version 6), the
    earlier channels at the pixel, and 1."""
    return 7 + c + (len(LS_EXTRA) if version >= 6 else 0)


def _ls_features(st: "_State", c: int, j: np.ndarray) -> np.ndarray:
    """[n, d] float32 features of channel c at pixels j (known): its six causal neighbours, the
    earlier channels' values at j, and 1; from version 6 also NNE, NWW, NNW and NNEE (LS_EXTRA, all
    in earlier wavefronts; N where outside the image). Small integers: exact in float32."""
    f = np.empty((len(j), _ls_dims(c, st.version)), dtype=np.float32)
    f[:, :6] = st.x[c][st.lay.nbr[:, j]].T
    for r in range(c):
        f[:, 6 + r] = st.x[r][j]
    f[:, 6 + c] = 1
    if st.version >= 6:
        f[:, 7 + c:] = st.x[c][st.lay.extra[:, j]].T
    return f


def _solve_spd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """w with a w = b for n symmetric positive definite systems laid out last: a [d, d, n], b [d, n]
    (both overwritten) -> w [d, n]. Gaussian elimination without pivoting, written as element-wise
    IEEE operations in a fixed order (numpy's ufuncs do not fuse multiply-adds), so every machine
    gets the same bits. No LAPACK: its blocking and kernels differ between builds. Each operation
    runs over n contiguous values (0.9.20; the same operations in the same order as 0.9.19's
    [n, d, d] layout, so the same bits, about 4x faster)."""
    d = b.shape[0]
    for k in range(d - 1):
        f = a[k + 1:, k] / a[k, k]                                    # [d-k-1, n]
        a[k + 1:, k + 1:] -= f[:, None] * a[k, None, k + 1:]
        b[k + 1:] -= f * b[k]
    w = np.zeros_like(b)
    for i in reversed(range(d)):
        acc = b[i]
        for j in range(i + 1, d):
            acc = acc - a[i, j] * w[j]
        w[i] = acc / a[i, i]
    return w


def _ls_window_rows(st: "_State", idx: np.ndarray) -> np.ndarray:
    """[n, K] rows of the least-squares table that pixels idx train on (_ls_window; st.lay.n, the
    zero row, where a window pixel lies outside the image). The same for every channel: kept for the
    last idx (the decoder's wavefront, which every channel predicts in turn)."""
    if st.window_rows is not None and st.window_rows[0] is idx:
        return st.window_rows[1]
    rows = _window_rows(st.lay, idx, _ls_window(st.version))
    st.window_rows = (idx, rows)
    return rows


def _window_rows(lay: _Layout, idx: np.ndarray, window: np.ndarray) -> np.ndarray:
    """[n, K] the pixels at the offsets `window` ([K, 2] (dy, dx), dy <= 0) of pixels idx; lay.n, the
    'no pixel' index, where one lies outside the image."""
    w_ = lay.w
    y, x = np.divmod(idx, w_)
    dy, dx = window[None, :, 0], window[None, :, 1]
    ok = (y[:, None] + dy >= 0) & (x[:, None] + dx >= 0) & (x[:, None] + dx < w_)   # [n, K]
    return np.where(ok, idx[:, None] + dy * w_ + dx, lay.n)


def _ls_predict(st: "_State", c: int, idx: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Version 2's eighth sub-predictor (GLICBAWLS-style), in 1/8 pixel: least squares on the
    pixels of _ls_window around each pixel (features from _ls_features), ridge LS_RIDGE. Pixels
    must come in an order where those are known (wavefronts, or raster order); it records the
    features of idx, and their values as far as known (the encoder's; the decoder's come in
    _State.record), for the pixels after them.

    The normal equations are sums of at most K products of integers up to 255: integers below
    2**24 (_LS_MAX_SUM), exact in float32 whatever order or kernel matmul sums them in. The solve
    and the prediction use element-wise IEEE operations only, rounded to the 1/8-pixel grid.
    Since 0.9.20 one gather of [features, value] rows (a window pixel outside the image reads the
    table's zero row n) and one matmul give both sides of the equations: the same integers as
    0.9.19's masked gathers and two matmuls, in half the time. w: the fits (_ls_fit) where made
    already (the decoder's companion process, _Companion, 0.10.4: the same fits from the same table)."""
    fi = _ls_features(st, c, idx)
    d = fi.shape[1]
    tab = st.feat[c]
    tab[idx, :d] = fi
    tab[idx, d] = st.x[c][idx]  # the encoder's values; the decoder's FILL until record() writes them
    if w is None:
        w = _ls_fit(st, c, idx)
    fi = fi.T.astype(np.float64, order="C")
    p = fi[0] * w[0]
    for k in range(1, d):
        p = p + fi[k] * w[k]
    p = np.rint(p * FRAC)
    return np.where(np.isfinite(p), np.minimum(np.maximum(p, 0), 255 * FRAC), FILL * FRAC).astype(np.int64)


def _ls_fit(st, c: int, idx: np.ndarray) -> np.ndarray:
    """[d, n] float64: the least-squares weights of channel c at pixels idx (_ls_predict), from the rows
    of st.feat[c] in their windows: pixels of earlier wavefronts only, so in the decoder a wavefront's
    fits need nothing of the wavefront itself (what lets a companion make them ahead: _Companion)."""
    d = _ls_dims(c, st.version)
    # np.take gathers whole rows about 5x faster than indexing tab[...] (the same values)
    f = np.take(st.feat[c], _ls_window_rows(st, idx), axis=0).astype(np.float32)     # [n, K, d + 1]
    g = np.matmul(f.transpose(0, 2, 1), f)                                            # [n, d + 1, d + 1]
    a = g[:, :d, :d].transpose(1, 2, 0).astype(np.float64, order="C")                 # [d, d, n]
    b = g[:, :d, d].T.astype(np.float64, order="C")                                   # [d, n]
    a[np.arange(d), np.arange(d)] += LS_RIDGE
    return _solve_spd(a, b)


def _diff_ref(st: "_State", c: int, j: np.ndarray) -> np.ndarray:
    """The reference plane of channel c's difference mode at pixels j (known there): channel 0
    (green); from version 4, for channel 2 (blue after green and red), (x_0 + x_1) // 2."""
    if st.version >= 4 and c == 2:
        return (st.x[0][j] + st.x[1][j]) >> 1
    return st.x[0][j]


def _diff_centre(st: "_State", c: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Version 3's difference mode for channel c > 0 at pixels idx (the reference channels known
    there): the prediction ref + MED(dN, dW, dN + dW - dNW) on the difference plane d = x_c - ref
    (LOCO-I's median edge detector; ref from _diff_ref), clipped to 0..255, and d at N, W, NW, NE
    [4, n] for the context."""
    nb = st.lay.nbr[:4, idx]
    d = st.x[c][nb] - _diff_ref(st, c, nb)
    dn, dw, dnw = d[0], d[1], d[2]
    med = np.maximum(np.minimum(dn, dw), np.minimum(np.maximum(dn, dw), dn + dw - dnw))
    return np.minimum(np.maximum(_diff_ref(st, c, idx) + med, 0), 255), d


def _diff_context(st: "_State", c: int, idx: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The difference mode's histogram row: activity level x clipped gradients x parity x the
    sign of channel c-1's difference-mode residual at idx (for c >= 2; 'zero' for c = 1)."""
    nb, e = st.lay.nbr[:4, idx], st.dres[c]
    a = np.abs(e[nb[0]]) + np.abs(e[nb[1]]) + np.abs(e[nb[2]]) + np.abs(e[nb[3]])
    ctx = (a >= DIFF_ACT[0]).astype(np.int64) + (a >= DIFF_ACT[1])
    for g in (d[0] - d[2], d[1] - d[2], d[3] - d[0]):  # N-NW, W-NW, NE-N
        ctx = ctx * _DIFF_G + np.minimum(np.maximum(g, -DIFF_GRAD), DIFF_GRAD) + DIFF_GRAD
    y, x = np.divmod(idx, st.lay.w)
    ctx = ctx * 4 + (y & 1) * 2 + (x & 1)
    return ctx * 3 + (np.sign(st.dres[c - 1][idx]) + 1 if c >= 2 else 1)


def _diff_coarse(fine: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Version 4's coarse row of the difference mode, from the fine row (_diff_context) and d at
    N, W, NW, NE: activity level x the gradients N-NW, W-NW, NE-N clipped to +-DIFF_COARSE_GRAD x
    row and column parity."""
    ctx = fine // (N_DIFF_CTX // len(DIFF_THETA))  # the activity level
    for g in (d[0] - d[2], d[1] - d[2], d[3] - d[0]):
        ctx = ctx * (2 * DIFF_COARSE_GRAD + 1) + np.minimum(np.maximum(g, -DIFF_COARSE_GRAD), DIFF_COARSE_GRAD)
        ctx = ctx + DIFF_COARSE_GRAD
    return ctx * 4 + fine // 3 % 4


def _order(c_: int, version: int) -> list[int]:
    """The planes' coding order: version 2 codes green first."""
    return [1, 0, 2] + list(range(3, c_)) if version >= 2 and c_ >= 3 else list(range(c_))


class _State:
    """Planes and per-pixel errors so far; every array has a sentinel slot at index n."""

    def __init__(self, layout: _Layout, c: int, version: int, ls: int = 0, ls_known: list | None = None,
                 shared: bool = False):
        """ls: the least-squares mode (0 off, 1 on, 2 on and boosted: version 6). ls_known: the
        least-squares sub-predictions of every pixel per channel, made already (an encoder's second
        option on the same planes: they depend on the pixels only); None for a channel whose are made
        here (and the whole list None: every channel's). shared: the least-squares table
        and the blend's errors in memory that a companion forked after it reads (_Companion)."""
        self.lay, self.version, self.ls, self.ls_known = layout, version, ls, ls_known
        self.x = [np.full(layout.n + 1, FILL, dtype=np.int64) for _ in range(c)]
        # The smallest exact types (memory, and the neighbour gathers' traffic): a sub-prediction
        # lies in -6120 .. 8160 (1/8 pixel; own ones in -2040 .. 4080: int16), so an error |8 x - p|
        # is at most 8160 and the blend's sum of six at most 48960 < 2**16 (uint16).
        k_ = 8 if ls else 7  # version 2 may add the local least-squares predictor
        self.zeros = workers.shared_zeros if shared else np.zeros
        self.err_sub = [self.zeros((layout.n + 1, k_ * (k + 1)), dtype=np.uint16) for k in range(c)]
        self.err = [np.zeros(layout.n + 1, dtype=np.int64) for _ in range(c)]
        self.own = [np.zeros((layout.n + 1, k_), dtype=np.int16) for _ in range(c)]
        # version 2: each pixel's least-squares features (pixel values and 1: uint8) and, last, its
        # value, for the pixels that train on it; row n stays 0 (a window pixel outside the image)
        makes = [ls_known is None or ls_known[k] is None for k in range(c)]
        self.feat = [self.zeros((layout.n + 1, _ls_dims(k, version) + 1), dtype=np.uint8) if makes[k] else None
                     for k in range(c)] if ls and any(makes) else None
        self.companion: _Companion | None = None  # the decoder's companion process, where it has one
        self.pred = [np.zeros(layout.n + 1, dtype=np.int64) for _ in range(c)]
        self.window_rows = None  # (idx, its least-squares window's rows): _ls_window_rows
        # version 3: the difference mode's residual x - prediction (channels after the first)
        self.dres = [np.zeros(layout.n + 1, dtype=np.int64) for _ in range(c)] if version >= 3 else None
        # version 7's decoder: per channel in the mixed mode, each pixel's blend minus difference-mode
        # codelength (_cost64; row n stays 0), and the last wavefront's window rows (_mix_rows)
        self.mixd: dict[int, np.ndarray] = {}
        self.mix_rows = None

    def inputs(self, c: int, idx: np.ndarray, ls_w: np.ndarray | None = None) -> np.ndarray:
        """Sub-predictions [n, 7 (c+1)] for channel c at pixels idx (neighbours known); ls_w: the
        least-squares fits where made already (_ls_predict)."""
        own = _subpredictors(self.x[c][self.lay.nbr[:, idx]])
        if self.ls:
            known = None if self.ls_known is None else self.ls_known[c]
            lsp = _ls_predict(self, c, idx, ls_w) if known is None else known[idx]
            own = np.concatenate([own, lsp[:, None]], axis=1)
        self.own[c][idx] = own  # channels > c reuse it at this pixel
        if c == 0:
            return own
        parts = [own]
        for r in range(c):  # gradient transfer from each earlier channel (done at idx already)
            parts.append(own + (FRAC * self.x[r][idx, None] - self.own[r][idx]))
        return np.concatenate(parts, axis=1)

    def blend(self, c: int, idx: np.ndarray, p: np.ndarray, weights: tuple | None = None) -> np.ndarray:
        """The blend of sub-predictions p; weights: _blend_weights's, where made already."""
        wt, tot = _blend_weights(self, c, idx) if weights is None else weights
        return ((wt * p).sum(axis=1) + tot // 2) // tot

    def bins(self, c: int, idx: np.ndarray) -> np.ndarray:
        nb, e = self.lay.nbr[:, idx], self.err[c]
        if self.version == 1:
            a = e[nb[:4]].sum(axis=0)
        else:
            a = (2 * (e[nb[0]] + e[nb[1]]) + e[nb[2]] + e[nb[3]] + e[nb[4]] + e[nb[5]]) // 2
        if c > 0:
            a = a + self.err[c - 1][idx]
        b = np.minimum(np.maximum(_bit_length((FRAC + a) ** 2) - 7, 0), N_BINS - 1)  # 2 log2(1+a/8)
        return np.where(idx == 0, N_BINS - 1, b)  # the first pixel is predicted from nothing

    def record(self, c: int, idx: np.ndarray, x: np.ndarray, p: np.ndarray, pred: np.ndarray):
        self.x[c][idx] = x
        if self.feat is not None:  # the decoder's values, for the least-squares fits after them
            self.feat[c][idx, -1] = x
        self.err_sub[c][idx] = np.abs(FRAC * x[:, None] - p)
        self.err[c][idx] = np.abs(FRAC * x - pred)
        self.pred[c][idx] = pred
        if self.companion is not None:  # last: everything the companion reads of channel c is in
            self.companion.recorded(c)


def _blend_weights(st, c: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The blend's weights [n, K] of channel c's sub-predictions at pixels idx, and their sums [n]: from
    the sub-predictors' errors at the six causal neighbours (earlier wavefronts only)."""
    nb = st.lay.nbr[:, idx]
    e = st.err_sub[c]
    s = (e[nb[0]] + e[nb[1]] + e[nb[2]] + e[nb[3]] + e[nb[4]] + e[nb[5]]).astype(np.int64)
    wt = _WEIGHT_ONE // (FRAC + s) ** 2
    if st.ls == 2:  # version 6's boosted mode: the least-squares sub-predictions (own and transferred)
        wt[:, 7::8] *= LS_BOOST
    return wt, wt.sum(axis=1)


def _bit_length(v: np.ndarray) -> np.ndarray:
    """bit_length of non-negative integers < 2**53: frexp is exact, no libm rounding involved."""
    return np.frexp(v.astype(np.float64))[1].astype(np.int64)


def _geometric(theta: int, mass: int) -> np.ndarray:
    """[511] integer counts of residuals -255..255, two-sided geometric (theta / 2**16)**|r|,
    summing to about `mass` (integer arithmetic; every count >= 1)."""
    g = [1 << 40]
    for _ in range(255):
        g.append(g[-1] * int(theta) >> 16)
    g = np.array(g, dtype=np.int64)
    two_sided = np.concatenate([g[:0:-1], g])
    return np.maximum(1, two_sided * mass // int(two_sided.sum()))


def _prior_counts() -> np.ndarray:
    """[2, N_BINS, 511] integer prior histograms of residuals -255..255 (integer arithmetic)."""
    return np.array([[_geometric(THETA[k, b], PRIOR_MASS) for b in range(N_BINS)] for k in range(2)])


@functools.lru_cache(maxsize=None)
def _prior() -> np.ndarray:
    out = _prior_counts()
    out.setflags(write=False)  # shared: callers copy
    return out


class _RowPrior(NamedTuple):
    """A prior whose rows come in runs of alike ones: row r's is kinds[r // per]. _Counts makes a
    row's counts only once a pixel uses it (the difference mode's 12,348 rows: a 32x32 image uses
    at most 1,024 of them, kodim01 and kodim23 3,113 - 3,581 for red and 8,120 - 9,548 for blue)."""
    kinds: np.ndarray  # [k, 511] the distinct rows
    per: int           # consecutive rows alike

    @property
    def n_rows(self) -> int:
        return len(self.kinds) * self.per

    def rows(self, r: np.ndarray) -> np.ndarray:
        return self.kinds[r // self.per]


@functools.lru_cache(maxsize=None)
def _diff_prior(n_rows: int = N_DIFF_CTX, mass: int = DIFF_PRIOR_MASS) -> _RowPrior:
    """The prior of the difference mode's rows (version 3's by default; version 4's coarse rows:
    N_DIFF_COARSE): by the row's activity level, its leading digit. int32 (counts up to `mass`),
    which _Counts widens where its rows do not halve."""
    assert n_rows % len(DIFF_THETA) == 0  # runs of equal length, one per activity level
    rows = np.stack([_geometric(t, mass) for t in DIFF_THETA]).astype(np.int32)
    rows.setflags(write=False)
    return _RowPrior(rows, n_rows // len(DIFF_THETA))


def _diff_priors(version: int) -> tuple[_RowPrior, _RowPrior | None]:
    """The difference mode's priors in a version: its rows', and version 4's coarse rows' (None before)."""
    if version >= 4:
        return _diff_prior(N_DIFF_CTX, DIFF_PRIOR_MASS_4), _diff_prior(N_DIFF_COARSE)
    return _diff_prior(), None


_TEX_WEIGHTS = 1 << np.arange(6, dtype=np.int64)


class _Bias:
    """Version 2's bias cancellation: the running mean error of the blend per (channel, bin, texture)."""

    def __init__(self, c_: int):
        self.s = np.zeros((c_, N_BINS << _N_TEX), dtype=np.int64)
        self.n = np.zeros((c_, N_BINS << _N_TEX), dtype=np.int64)

    @staticmethod
    def context(st: _State, c: int, idx: np.ndarray, pred: np.ndarray, bins: np.ndarray) -> np.ndarray:
        t = (FRAC * st.x[c][st.lay.nbr[:, idx]] > pred).T.astype(np.int64) @ _TEX_WEIGHTS
        if c > 0:
            t = t + ((FRAC * st.x[c - 1][idx] > st.pred[c - 1][idx]) << 6)
        return (bins << _N_TEX) + t

    def correct(self, c: int, ctx: np.ndarray, pred: np.ndarray) -> np.ndarray:
        d = self.n[c, ctx] + BIAS_SHRINK
        return pred + (2 * self.s[c, ctx] + d) // (2 * d)

    def update(self, c: int, ctx: np.ndarray, x: np.ndarray, pred: np.ndarray) -> None:
        e = FRAC * x - pred
        keep = np.abs(e) <= BIAS_MAX_ERR
        ctx = ctx[keep]
        np.add.at(self.s[c], ctx, e[keep])
        np.add.at(self.n[c], ctx, 1)
        full = np.unique(ctx[self.n[c, ctx] >= BIAS_HALVE])
        self.s[c, full] //= 2
        self.n[c, full] //= 2


class _Cascade:
    """Version 8's error feedback on the blend (after the bias correction): the prediction q = p +
    round(v . w / 2**CASCADE_SHIFT), v the blend's errors 8 x - pred at the pixel's neighbours N, W,
    NW, NE, WW, NN (1/8 pixel, from the recorded values and predictions: known to the decoder for every
    channel, whatever its mode), w the weights of the pixel's (channel, bin). After the pixel, the
    normalized LMS step w += 2**-CASCADE_RATE v (8 x - q) / (1 + |v|**2), rounded to the weights'
    grid, each weight clipped to +-CASCADE_MAX. A wavefront's pixels all read the weights as they were
    before it and add their steps together (exact integers: the order does not matter). Where the
    blend's errors correlate with its neighbours' (its sub-predictors' shared blind spots, texture),
    the weights learn it; elsewhere they stay near 0. Integer arithmetic only: every machine agrees."""

    def __init__(self, c_: int):
        self.w = np.zeros((c_, N_BINS, 6), dtype=np.int64)

    @staticmethod
    def features(st: _State, c: int, idx: np.ndarray) -> np.ndarray:
        """[n, 6] the blend's errors 8 x - pred of channel c at the neighbours of pixels idx."""
        nb = st.lay.nbr[:, idx]
        return (FRAC * st.x[c][nb] - st.pred[c][nb]).T

    def correct(self, c: int, bins: np.ndarray, v: np.ndarray, pred: np.ndarray) -> np.ndarray:
        return pred + (((v * self.w[c, bins]).sum(axis=1) + (1 << (CASCADE_SHIFT - 1))) >> CASCADE_SHIFT)

    def update(self, c: int, bins: np.ndarray, v: np.ndarray, x: np.ndarray, q: np.ndarray) -> None:
        den = 2 * (1 + (v * v).sum(axis=1))[:, None]
        num = (v * (FRAC * x - q)[:, None]) << (CASCADE_SHIFT - CASCADE_RATE + 1)
        np.add.at(self.w[c], bins, (num + den // 2) // den)
        np.clip(self.w[c], -CASCADE_MAX, CASCADE_MAX, out=self.w[c])


def _centre(pred: np.ndarray, version: int) -> tuple[np.ndarray, np.ndarray]:
    """(p, sign): the histogram is centred at p, and residuals are sign * (x - p).

    Version 1: p = round(pred), sign +1. Version 2: p is the integer nearest pred; where it lies
    above pred (fraction >= 1/2) the residual is mirrored."""
    if version == 1:
        return np.minimum(np.maximum((pred + FRAC // 2) // FRAC, 0), 255), np.ones_like(pred)
    pc = np.minimum(np.maximum(pred, 0), 255 * FRAC)
    up = (pc % FRAC >= FRAC // 2).astype(np.int64)
    return np.minimum(pc // FRAC + up, 255), 1 - 2 * up


def _slot(x: np.ndarray, p: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """Histogram column of x: residual sign * (x - p), offset by 255."""
    return sign * (x - p) + 255


def _start(p: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """First histogram column of the window of x = 0..255 (x = 0 at its end when mirrored)."""
    return np.where(sign > 0, 255 - p, p)


def _tables(windows: np.ndarray, bins: np.ndarray, p: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """[n, 256] float64 counts of x = 0..255: the residual histogram window around p.

    windows = sliding_window_view(hist, 256, axis=1), a live view of the histogram."""
    t = windows[bins, _start(p, sign)]
    flip = sign < 0
    if flip.any():
        t[flip] = t[flip, ::-1]
    return t.astype(np.float64)


def _halve(hist: np.ndarray, total: np.ndarray, rows: np.ndarray, limit: int | None
           ) -> tuple[np.ndarray, np.ndarray] | None:
    """Version 6: halve (rounding up: every count stays >= 1) the rows among `rows` whose total
    exceeds `limit`, so the histograms follow the image; None where none does (or no limit), else
    (those rows, their counts before) for a pusher that rewinds. total: each row's sum, kept with the
    counts (_Rows.total; 0.10.5: before, each wavefront summed its rows' 511 counts)."""
    if limit is None:
        return None
    over = rows[total[rows] > limit]
    if not len(over):
        return None
    big = np.unique(over)
    saved = hist[big].copy()
    hist[big] = (saved + 1) >> 1
    total[big] = hist[big].sum(axis=1)
    return big, saved


class _Rows:
    """Histogram rows [n, 511] from a prior: all at once (an array) or, from a _RowPrior, each made
    the first time a pixel uses it (map: rows -> their slots in hist, in order of first use). The
    counts in a slot are those the row would hold in the full array, so the bits are the same.
    totals: also each slot's sum (the coarse rows' scale)."""

    def __init__(self, prior, dtype, totals: bool = False):
        self.prior = prior if isinstance(prior, _RowPrior) else None
        if self.prior is None:
            self._set(prior.astype(dtype))
        else:
            self.slot = np.full(self.prior.n_rows, -1, dtype=np.int64)
            self.used = 0
            self._set(np.zeros((64, self.prior.kinds.shape[1]), dtype))
        self.total = self.hist.sum(axis=1) if totals else None

    def _set(self, hist: np.ndarray) -> None:
        self.hist = hist
        self.windows = sliding_window_view(hist, 256, axis=1)

    def __getstate__(self) -> dict:  # pickled, the windows (a view of hist) would be copied 256 times over
        return {k: v for k, v in self.__dict__.items() if k != "windows"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._set(self.hist)

    def trim(self) -> None:
        """Drop the slots made for rows not yet used (growing doubles them): for counts kept (_Run)."""
        if self.prior is not None and self.used < len(self.hist):
            self._set(self.hist[:self.used].copy())
            if self.total is not None:
                self.total = self.total[:self.used].copy()

    def arrays(self) -> list[np.ndarray]:
        """The arrays these rows hold (their memory)."""
        return [a for a in (self.hist, self.total, getattr(self, "slot", None)) if a is not None]

    def map(self, rows: np.ndarray) -> np.ndarray:
        """The slots of `rows` (row numbers), making the rows not used before from the prior."""
        if self.prior is None:
            return rows
        s = self.slot[rows]
        if (s >= 0).all():
            return s
        fresh = np.unique(rows[s < 0])
        lo, hi = self.used, self.used + len(fresh)
        if hi > len(self.hist):  # grow by doubling (at most every row)
            grown = np.zeros((min(max(2 * len(self.hist), hi), self.prior.n_rows), self.hist.shape[1]),
                             self.hist.dtype)  # zeros, not empty: the same state wherever it ran
            grown[:lo] = self.hist[:lo]
            self._set(grown)
            if self.total is not None:
                self.total = np.concatenate([self.total[:lo], np.zeros(len(grown) - lo, self.total.dtype)])
        self.hist[lo:hi] = self.prior.rows(fresh)
        if self.total is not None:
            self.total[lo:hi] = self.hist[lo:hi].sum(axis=1)
        self.slot[fresh] = np.arange(lo, hi)
        self.used = hi
        return self.slot[rows]


# A coarse row's share c * DIFF_MIX // T (c <= T, its total) is floor(c * DIFF_MIX / T) in float64 too: the
# product is exact (below 2**53), and the quotient q <= DIFF_MIX = 2**12, where a double's spacing is at
# most 2**-40, lies at least 1 / T from the next integer above unless it is one (then exact), so for T
# below 2**40 rounding never reaches that integer and the floor is the integer quotient.
_FLOOR_DIV_EXACT = 1 << 40
assert DIFF_MIX <= 1 << 12


class _Counts:
    """The adaptive counts one plane is coded with: rows of residual histograms (integer counts)
    and, in version 4's difference mode, coarse rows whose window is added to a pixel's row scaled
    to DIFF_MIX in total (integer floor division: exact on every machine). halve_at (version 6's
    blend rows, version 7's difference-mode rows): settle() halves a row past that total. Rows that
    halve stay far below 2**31 (_mix_tables' bound), so they are kept in int32, the same bits. The
    difference mode's rows (12,348 fine, 1,500 coarse: 25 + 6 MB a plane) are made as pixels first
    use them (_Rows), so a small image holds only those it uses. Every method takes row numbers;
    hist and settle()'s rows are in slots (fine_slots)."""

    def __init__(self, prior, cprior=None, halve_at: int | None = None):
        self.fine = _Rows(prior, np.int32 if halve_at is not None else np.int64, totals=halve_at is not None)
        self.halve_at = halve_at
        self.coarse = None if cprior is None else _Rows(cprior, np.int64, totals=True)  # x DIFF_MIX: 64 bits

    @property
    def hist(self) -> np.ndarray:
        return self.fine.hist

    def fine_slots(self, rows: np.ndarray) -> np.ndarray:
        return self.fine.map(rows)

    def tables(self, rows: np.ndarray, crows: np.ndarray | None, p: np.ndarray, sign: np.ndarray) -> np.ndarray:
        """[n, 256] float64 counts of x = 0..255 around p (_tables, plus the coarse rows' share)."""
        rows = self.fine.map(rows)
        if self.coarse is None:
            return _tables(self.fine.windows, rows, p, sign)
        crows = self.coarse.map(crows)
        lo = _start(p, sign)
        total = self.coarse.total[crows, None]
        if total.max(initial=0) < _FLOOR_DIV_EXACT:  # the same integers in float64, about twice as fast (0.10.4)
            t = self.coarse.windows[crows, lo].astype(np.float64)
            t *= DIFF_MIX
            t /= total
            np.floor(t, out=t)
            t += self.fine.windows[rows, lo]
        else:
            t = (self.fine.windows[rows, lo] + self.coarse.windows[crows, lo] * DIFF_MIX // total).astype(np.float64)
        flip = sign < 0
        if flip.any():
            t[flip] = t[flip, ::-1]
        return t

    def add(self, rows: np.ndarray, crows: np.ndarray | None, slot: np.ndarray, inc: int) -> None:
        self.add_slots(self.fine.map(rows), slot, inc)  # first: a new row may grow hist
        if self.coarse is not None:
            crows = self.coarse.map(crows)
            np.add.at(self.coarse.hist, (crows, slot), inc)
            np.add.at(self.coarse.total, crows, inc)

    def add_slots(self, slots: np.ndarray, slot: np.ndarray, inc: int) -> None:
        """add() to the fine rows, given as slots (fine_slots)."""
        np.add.at(self.fine.hist, (slots, slot), inc)
        if self.fine.total is not None:
            np.add.at(self.fine.total, slots, inc)

    def settle(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """After a wavefront's add: halve its rows past halve_at (_halve); the halved rows as slots."""
        return self.settle_slots(self.fine.map(rows))

    def settle_slots(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """settle(), the rows given as slots."""
        return _halve(self.fine.hist, self.fine.total, slots, self.halve_at)

    def restore(self, slots: np.ndarray, before: np.ndarray) -> None:
        """Undo settle()'s halving of these slots (a pusher rewinding): their counts before it."""
        self.fine.hist[slots] = before
        self.fine.total[slots] = before.sum(axis=1)


class _Run(NamedTuple):
    """A plan's counts after the last wavefront (`kept`: [them], until a pusher takes them) and their
    halvings, {wavefront: (slots, their counts before)}: what the analysis ran through
    (_plane_pixel_bits) and the pusher rewinds (_push_plans)."""
    kept: list
    halved: dict

    def take(self) -> _Counts | None:
        """The counts for a pusher, which rewinds them: taken, not copied (a copy would be the memory
        of the difference mode's rows again, tens of MB), so a later push of the same plan (rare: one
        of shared_analyses()'s) runs its own, the same; None once taken."""
        return self.kept.pop() if self.kept else None

    def arrays(self) -> list[np.ndarray]:
        """The arrays it holds (its memory: _nbytes)."""
        rows = [r for cc in self.kept for r in (cc.fine, cc.coarse) if r is not None]
        return [a for r in rows for a in r.arrays()] + [a for event in self.halved.values() for a in event]


def _known_state(planes: np.ndarray, layout: _Layout, version: int, ls: int = 0, ls_known: list | None = None):
    """Encoder side: (the planes in coding order [C, n] int64, a _State holding them as known pixels)."""
    flat = planes[_order(planes.shape[0], version)].reshape(planes.shape[0], layout.n).astype(np.int64)
    st = _State(layout, len(flat), version, ls, ls_known)
    for c in range(len(flat)):
        st.x[c][:layout.n] = flat[c]
    return flat, st


def _predict(planes: np.ndarray, layout: _Layout, version: int, ls: int = 0, ls_known: list | None = None):
    """Encoder side, all pixels at once: the planes in coding order, the blend's predictions (1/8
    pixel) and the bins, per channel; and the state holding them (ls, ls_known: _State's, where a
    plane's may also be a function that returns them, called as that plane's turn comes)."""
    c_, n = planes.shape[0], layout.n
    flat, st = _known_state(planes, layout, version, ls, None if ls_known is None else list(ls_known))
    every = np.arange(n)
    preds, bins = [], []
    chunks = np.array_split(every, max(1, n // _CHUNK))  # bounded temporaries, cache-friendly
    for c in range(c_):
        if st.ls_known is not None and callable(st.ls_known[c]):  # made in another process (_analysis)
            st.ls_known[c] = st.ls_known[c]()
        pred = np.empty(n, dtype=np.int64)
        subs = []
        for idx in chunks:
            subs.append(st.inputs(c, idx).astype(np.int16))  # -6120 .. 8160 (_State)
            st.err_sub[c][idx] = np.abs(FRAC * flat[c][idx, None] - subs[-1])
        for idx, p in zip(chunks, subs):  # every error is in: blend with the neighbours' errors
            pred[idx] = st.blend(c, idx, p)
        del subs
        st.err[c][:n] = np.abs(FRAC * flat[c] - pred)
        st.pred[c][:n] = pred
        preds.append(pred)
        bins.append(np.concatenate([st.bins(c, idx) for idx in chunks]))
    return flat, preds, bins, st


def _analyse(planes: np.ndarray, layout: _Layout, version: int, ls: int = 0, ls_known: list | None = None):
    """Encoder side: the planes in coding order, and per channel the histogram row, centre and
    sign of every pixel (the decoder computes the same wavefront by wavefront); and the state."""
    flat, preds, bins, st = _predict(planes, layout, version, ls, ls_known)
    if version >= 2:  # the bias adapts as pixels come: run it in the decoder's order
        bias = _Bias(len(flat))
        cascade = _Cascade(len(flat)) if version >= 8 else None
        corrected = [p.copy() for p in preds]
        for idx in layout.steps:
            for c in range(len(flat)):
                ctx = _Bias.context(st, c, idx, preds[c][idx], bins[c][idx])
                q = bias.correct(c, ctx, preds[c][idx])
                bias.update(c, ctx, flat[c][idx], preds[c][idx])
                if cascade is not None:
                    v = _Cascade.features(st, c, idx)
                    q = cascade.correct(c, bins[c][idx], v, q)
                    cascade.update(c, bins[c][idx], v, flat[c][idx], q)
                corrected[c][idx] = q
        preds = corrected
    centres = [_centre(p, version) for p in preds]
    return flat, bins, [cp[0] for cp in centres], [cp[1] for cp in centres], st


class _Plan(NamedTuple):
    """How the encoder codes one plane: per pixel the histogram row, centre and sign; the rows'
    prior; whether it is version 3's difference mode (a flag in the stream); version 4's coarse
    rows in that mode and their prior (None: none); version 6's halving limit of the rows (None:
    they never halve); version 7: each pixel's codelength in 1/64 bit (_cost64), which the mixed
    mode's weights read (None before)."""
    rows: np.ndarray
    centres: np.ndarray
    signs: np.ndarray
    prior: np.ndarray
    diff: bool = False
    coarse: np.ndarray | None = None
    cprior: np.ndarray | None = None
    halve: int | None = None
    cost: np.ndarray | None = None
    run: _Run | None = None

    @property
    def mode(self) -> int:
        """The plane's mode in the stream: 0 the blend, 1 the difference mode (2: _Mix)."""
        return int(self.diff)

    def counts(self) -> _Counts:
        return _Counts(self.prior, self.cprior, self.halve)

    @classmethod
    def compact(cls, rows, centres, signs, prior, diff=False, coarse=None, cprior=None, halve=None) -> "_Plan":
        """A plan in small integer types (an encoder keeps one per plane and option): rows below
        2**15 (N_DIFF_CTX at most), centres 0 .. 255, signs +-1. Numpy widens them wherever they
        meet the int64 pixels and counts, so the bits are those of int64 plans."""
        return cls(rows.astype(np.int16), centres.astype(np.int16), signs.astype(np.int8), prior, diff,
                   None if coarse is None else coarse.astype(np.int16), cprior, halve)


def _plane_pixel_bits(lay: _Layout, x: np.ndarray, plan: _Plan, cost: bool = False
                      ) -> tuple[np.ndarray, np.ndarray | None, _Run]:
    """([n] bits of each pixel of one histogram-coded plane (float64 model of what the coder pushes),
    with cost [n] int32 the same codelengths in 1/64 bit from the integer counts (_cost64), else None,
    the counts after the last wavefront and their halvings (_Run), which the pusher rewinds from).
    The counts learn from every pixel, so a pixel's bits do not depend on which others are coded."""
    out = np.empty(lay.n)
    c64 = np.empty(lay.n, dtype=np.int32) if cost else None
    counts, halved = plan.counts(), {}
    few = counts.coarse is None and counts.fine.prior is None and len(counts.hist) <= N_BINS
    for k, idx in enumerate(lay.steps):
        p, sg, xi = plan.centres[idx], plan.signs[idx], x[idx]
        slot = _slot(xi, p, sg)
        if counts.coarse is not None:  # version 4's difference mode: the coder's tables themselves
            b, cb = plan.rows[idx], plan.coarse[idx]
            t = counts.tables(b, cb, p, sg)
            tx, total = t[np.arange(len(idx)), xi], t.sum(axis=1)
            counts.add(b, cb, slot, INC)
            event = counts.settle(b)
        else:
            b = counts.fine_slots(plan.rows[idx])
            hist = counts.hist  # after the slots: it may have grown
            lo = _start(p, sg)
            h, r = (hist, b) if few else (hist[b], np.arange(len(idx)))  # few rows: cumulate them all
            cum = np.concatenate([np.zeros((len(h), 1), np.int64), np.cumsum(h, axis=1)], axis=1)
            tx, total = h[r, slot], cum[r, lo + 256] - cum[r, lo]
            counts.add_slots(b, slot, INC)
            event = counts.settle_slots(b)
        out[idx] = -np.log2(tx / total)
        if cost:
            c64[idx] = _cost64(tx, total)
        if event is not None:
            halved[k] = event
    counts.fine.trim()  # kept: without the slots made for rows never used
    if counts.coarse is not None:
        counts.coarse.trim()
    return out, c64, _Run([counts], halved)


def _diff_plans(st: _State, lay: _Layout, flat: list[np.ndarray]) -> list:
    """Version 3's difference mode for every channel c > 0 (None for channel 0): (pixel bits, _Plan);
    from version 7 its rows halve as the blend's do (_diff_halve) and, where the planes may mix, the
    plan holds its costs."""
    out: list = [None]
    every = np.arange(lay.n)
    centres = [None] + [_diff_centre(st, c, every) for c in range(1, len(flat))]
    for c in range(1, len(flat)):  # every residual first: channel c's contexts read c-1's
        st.dres[c][: lay.n] = flat[c] - centres[c][0]
    for c in range(1, len(flat)):
        p, d = centres[c]
        rows = _diff_context(st, c, every, d)
        prior, cprior = _diff_priors(st.version)
        coarse = None if cprior is None else _diff_coarse(rows, d)
        plan = _Plan.compact(rows, p, np.ones_like(p), prior, True, coarse, cprior, _diff_halve(st.version))
        out.append(_with_costs(lay, flat[c], plan, _mixes(lay, st.version)))
    return out


def _with_costs(lay: _Layout, x: np.ndarray, plan: _Plan, costs: bool) -> tuple[np.ndarray, _Plan]:
    """(pixel bits, the plan), holding the counts' run (_Plan.run, for the pusher) and, with costs, the
    pixels' codelengths (_Plan.cost, for the mixed mode)."""
    bits, cost, run = _plane_pixel_bits(lay, x, plan, costs)
    return bits, plan._replace(cost=cost, run=run)


def _diff_halve(version: int) -> int | None:
    """The difference mode's fine rows halve past HIST_HALVE from version 7 (None: never), so that
    its counts' sums stay bounded as the blend's do (_mix_tables)."""
    return HIST_HALVE if version >= 7 else None


# --- version 7: the mixed mode ----------------------------------------------------------------
# Where the blend and the difference mode each do well in different parts of a plane (a photograph's
# chroma: smooth here, textured there), a per-channel choice keeps the better on average; a mixture
# of their two distributions, weighted by how each did on the neighbouring pixels, follows them
# pixel by pixel. Measured before building it (encoder's codelengths, the 24 Kodak images, the
# 2-core Intel Xeon): 2.7770 -> 2.7265 bits/dim.


def _log64_table() -> np.ndarray:
    """[128] floor(64 log2(j / 128)) for j = 128 .. 255, from integer comparisons (the largest k
    with 2**k 128**64 <= j**64): the same table on every machine."""
    out = []
    for j in range(128, 256):
        k = 0
        while 2 ** (k + 1) * 128 ** 64 <= j ** 64:
            k += 1
        out.append(k)
    return np.array(out, dtype=np.int64)


_LOG64 = _log64_table()


def _log64(v: np.ndarray) -> np.ndarray:
    """64 log2(v), rounded down to within 0.03 bit, for integers 1 <= v < 2**53, in integer
    arithmetic: 64 x the exponent plus _LOG64 of the top 8 bits."""
    v = np.asarray(v).astype(np.int64)
    e = _bit_length(v) - 1
    top = np.where(e >= 7, v >> np.maximum(e - 7, 0), v << np.maximum(7 - e, 0))
    return 64 * e + _LOG64[top - 128]


def _cost64(count: np.ndarray, total: np.ndarray) -> np.ndarray:
    """The codelength of a count out of a total (integers) in 1/64 bit: _log64(total) - _log64(count)."""
    return _log64(total) - _log64(count)


def _iroot16(v: int) -> int:
    """floor(v ** (1 / 16)) of an integer v >= 0: isqrt four times (floor(sqrt(floor(y))) = floor(sqrt(y)))."""
    for _ in range(4):
        v = math.isqrt(v)
    return v


def _mix_table() -> np.ndarray:
    """[2 MIX_U + 1] the blend's weight for u = -MIX_U .. MIX_U: round(2**MIX_K / (1 + 2**(u / 16)))
    kept within 1 .. 2**MIX_K - 1, in integer arithmetic (2**(u / 16) as floor(2**(40 + u / 16)) / 2**40)."""
    one, out = 1 << 40, []
    for u in range(-MIX_U, MIX_U + 1):
        p = _iroot16(1 << (16 * 40 + u))
        out.append(min(max(((1 << MIX_K) * one + (one + p) // 2) // (one + p), 1), (1 << MIX_K) - 1))
    return np.array(out, dtype=np.int64)


_MIX_W = _mix_table()


def _mix_weight(s: np.ndarray) -> np.ndarray:
    """The blend's weight (1 .. 2**MIX_K - 1, in 1 / 2**MIX_K) from s, the sum over MIX_WINDOW of the
    blend's codelength minus the difference mode's (1/64 bit; floor division, as the decoder does)."""
    return _MIX_W[np.clip(np.floor_divide(s, MIX_DIV), -MIX_U, MIX_U) + MIX_U]


MIX_WINDOW = _ls_offsets(MIX_RADIUS)


def _mix_weights(lay: _Layout, dcost: np.ndarray) -> np.ndarray:
    """Encoder: [n] uint8 the blend's weight at every pixel, from dcost [n] (each pixel's blend minus
    difference-mode codelength, _cost64): the window sums that the decoder makes wavefront by
    wavefront (_mix_rows), a window pixel outside the image counting 0."""
    r, h, w = MIX_RADIUS, lay.h, lay.w
    d = np.zeros((h + r, w + 2 * r), dtype=np.int64)
    d[r:, r:r + w] = dcost.reshape(h, w)
    s = np.zeros((h, w), dtype=np.int64)
    for dy, dx in MIX_WINDOW:
        s += d[r + dy:r + dy + h, r + dx:r + dx + w]
    return _mix_weight(s.ravel()).astype(np.uint8)


def _mix_rows(st: "_State", idx: np.ndarray) -> np.ndarray:
    """Decoder: [n, 36] the rows of st.mixd that pixels idx's weights sum (MIX_WINDOW; the zero row
    st.lay.n outside the image); kept for the last idx, which every mixed channel reads in turn."""
    if st.mix_rows is None or st.mix_rows[0] is not idx:
        st.mix_rows = (idx, _window_rows(st.lay, idx, MIX_WINDOW))
    return st.mix_rows[1]


def _mix_tables(tb: np.ndarray, td: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """([n, 256] float64 counts, S_b, S_d [n]): the mixture of the blend's tables tb and the difference mode's td,
    the blend weighing w / 2**MIX_K: w tb S_d + (2**MIX_K - w) td S_b (S: each table's sum), exact
    integers. A row that halves past HIST_HALVE = L after each wavefront's counts (at most A = 64 x
    ceil(width / 2)) starts every wavefront at most max(L, A + 1) (by induction: a halved row holds
    ceil((T + a) / 2) <= (max(L, A + 1) + A + 1) / 2), so it holds at most L + 2A + 1 < 2**23 on planes
    at most MIX_MAX_WIDTH wide; the difference mode's coarse share adds at most DIFF_MIX. Hence S_b,
    S_d < 2**23, and every count and the mixture's sum 2**MIX_K S_b S_d stay below 2**52. The sums
    come back too: the decoder's costs read them."""
    wf = w.astype(np.float64)
    sb, sd = tb.sum(axis=1), td.sum(axis=1)
    return tb * (wf * sd)[:, None] + td * (((1 << MIX_K) - wf) * sb)[:, None], sb, sd


def _mix_bits(vb: np.ndarray, vd: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[n] bits of each pixel in the mixed mode (float64 model): from the two modes' bits and the
    weights, -log2((w 2**-vb + (2**MIX_K - w) 2**-vd) / 2**MIX_K)."""
    w = w.astype(np.float64)
    return MIX_K - np.logaddexp2(np.log2(w) - vb, np.log2((1 << MIX_K) - w) - vd)


def _can_mix(lay: _Layout, version: int) -> bool:
    """Whether the encoder may choose the mixed mode: version 7 on, planes at most MIX_MAX_WIDTH wide."""
    return version >= 7 and lay.w <= MIX_MAX_WIDTH


def _mixes(lay: _Layout, version: int) -> bool:
    """Whether the encoder tries the mixed mode: where it may (_can_mix), at effort 2 and up."""
    return _can_mix(lay, version) and _EFFORT.get() >= 2


class _Mix(NamedTuple):
    """Version 7's mixed mode of one plane: the blend's plan, the difference mode's, and per pixel
    the blend's weight (_mix_weights)."""
    blend: _Plan
    other: _Plan
    weights: np.ndarray
    mode = 2  # the plane's mode in the stream


SHARED_BYTES = 1 << 29  # what shared_analyses() keeps at most (a 768x512 image: 67 MB in version 6, 52 in 5)
# shared_analyses(): the analyses of its scope by (version, shape, dtype, digest of the planes); None: no scope
_SHARED: contextvars.ContextVar["_Store | None"] = contextvars.ContextVar("seed_codec_analyses", default=None)


class _Option(NamedTuple):
    """One least-squares option of an image's analysis (its mode: 0 off, 1 on, 2 boosted): the planes
    in coding order and per plane None (constant) or ((pixel bits, _Plan) of the blend, (pixel bits,
    _Plan) of the difference mode or None, (pixel bits, _Mix) of version 7's mixed mode or None)."""
    ls: int
    flat: np.ndarray
    planes: list


def _ls_modes(version: int) -> tuple[int, ...]:
    """The least-squares modes the encoder tries: none in version 1, off / on from version 2, and
    from version 6 on with the boost (LS_BOOST) too, coded as one of three."""
    return (0,) if version == 1 else (0, 1) if version < 6 else (0, 1, 2)


def _ls_candidates(version: int) -> tuple[int, ...]:
    """The least-squares modes the encoder tries at the scope's effort: all of _ls_modes at the
    highest, the first (off) below it."""
    modes = _ls_modes(version)
    return modes if _EFFORT.get() >= MAX_EFFORT else modes[:1]


def _ls_mode_codec(version: int) -> Codec:
    """The least-squares mode in the stream (version 2 on): uniform over _ls_modes(version), so a
    flag in versions 2 - 5 and one of three in version 6."""
    return uniform(len(_ls_modes(version)), ())


def _ls_mode_bits(version: int) -> float:
    """What the least-squares mode costs in the stream (nothing in version 1, which has none)."""
    return float(np.log2(len(_ls_modes(version))))


_MODE3 = uniform(3, ())  # version 7: a plane's mode (_Plan.mode, _Mix.mode)


def _plane_mode_bits(version: int) -> float:
    """What the mode of a plane after the first costs in the stream: a flag (the difference mode or
    not) in versions 3 - 6, one of three (the blend, the difference mode, the mixed mode) from 7."""
    return float(np.log2(3)) if version >= 7 else 1.0


def _blend_halve(version: int) -> int | None:
    """The blend mode's histogram rows halve past HIST_HALVE from version 6 (None: never)."""
    return HIST_HALVE if version >= 6 else None


def _analysis(planes: np.ndarray, lay: _Layout, version: int) -> list[_Option]:
    """Everything the encoder's choice of modes reads, per least-squares option: the expensive
    part of every push (on a 768x512 image about 8 s for version 5's two options, 11 - 14 s for
    version 6's three, one thread). Taken from the scope's
    store where shared_analyses() is active and these planes were analysed already. Where
    _in_parallel says so, a second process makes the first option (no least squares) and the difference
    mode's plans while this one makes the others; where the effort tries one option only, the
    difference mode's plans alone (0.10.3); and where it tries options with least squares, first the last
    plane's least-squares sub-predictions (_ls_own; 0.10.5: the second process had the less to do). The
    same options either way."""
    store = _SHARED.get()
    key = None
    if store is not None:
        key = _key(planes, version)
        if key in store.items:
            return store.items[key][0]
    modes = _ls_candidates(version)
    whole = len(modes) > 1  # the other process makes the first option, not only the difference mode's plans
    calls = []
    if _in_parallel(lay, version, _needs_diff(planes, version)):
        if whole and planes.shape[0] > 1:
            calls.append((_ls_own, planes, version, planes.shape[0] - 1))
        calls.append((_first_option if whole else _diff_only, planes, version, _EFFORT.get()))
    with workers.background_calls(calls) if calls else contextlib.nullcontext() as pending:
        known = None
        if pending and len(pending) > 1:  # the last plane's sub-predictions, as this process reaches them
            known = [None] * (planes.shape[0] - 1) + [pending[0].result]
        out = []
        for ls in modes[1:] if pending and whole else modes:
            option, known = _option(planes, lay, version, ls, known)
            out.append(option)
        if pending:
            first, diff = pending[-1].result()
            out = [first] * whole + out
        else:
            diff = _diff_only(planes, version, _EFFORT.get())[1] if _needs_diff(planes, version) else None
    out = [_mixed(o, diff, lay, version) for o in out]
    out = [o._replace(flat=out[0].flat) for o in out]  # the same planes: one copy
    if store is not None:
        store.put(key, out)
    return out


def _option(planes: np.ndarray, lay: _Layout, version: int, ls: int, known: list | None
            ) -> tuple[_Option, list | None]:
    """One least-squares option's analysis with its blend plans alone (the difference and mixed modes:
    _mixed), and the next option's least-squares sub-predictions (every plane's: made here, or passed
    in `known`, _State's ls_known; None without least squares). Its state is not kept: an option's
    arrays are several times the planes'."""
    flat, bins, centres, signs, st = _analyse(planes, lay, version, ls, known)
    if ls:  # the boosted option's sub-predictions are these (made once: they depend on the pixels only)
        known = [own[:, 7].copy() for own in st.own]
    per = []
    for c in range(len(flat)):
        if (flat[c] == flat[c][0]).all():
            per.append(None)
            continue
        plan = _Plan.compact(bins[c], centres[c], signs[c], _prior()[min(c, 1)], halve=_blend_halve(version))
        per.append((_with_costs(lay, flat[c], plan, version >= 3 and c > 0 and _mixes(lay, version)), None, None))
    return _Option(ls, flat, per), known


def _mixed(option: _Option, diff: list | None, lay: _Layout, version: int) -> _Option:
    """The option with each plane's difference mode (diff: _diff_plans's, version 3 on) and, where the
    planes mix (_mixes), the mixed mode beside its blend."""
    per = []
    for c, entry in enumerate(option.planes):
        if entry is None or c == 0 or version < 3:
            per.append(entry)
            continue
        blend, other, mix = entry[0], diff[c], None
        if _mixes(lay, version):
            w = _mix_weights(lay, blend[1].cost.astype(np.int64) - other[1].cost)
            mix = (_mix_bits(blend[0], other[0], w), _Mix(blend[1], other[1], w))
        per.append((blend, other, mix))
    return option._replace(planes=per)


def _first_option(planes: np.ndarray, version: int, level: int) -> tuple[_Option, list | None]:
    """The first least-squares option's analysis (its blend plans: _option) and the difference mode's
    plans (None where no plane after the first needs them) at effort `level`: _analysis's other process."""
    lay = _layout(*planes.shape[1:])
    with effort(level):
        option, _ = _option(planes, lay, version, _ls_candidates(version)[0], None)
    return option, _diff_only(planes, version, level)[1] if _needs_diff(planes, version) else None


def _diff_only(planes: np.ndarray, version: int, level: int) -> tuple[None, list]:
    """(None, the difference mode's plans) at effort `level`: _analysis's other process where the
    effort tries one least-squares option only (the plans read the planes alone, not the option)."""
    lay = _layout(*planes.shape[1:])
    flat, st = _known_state(planes, lay, version)
    with effort(level):
        return None, _diff_plans(st, lay, list(flat))


def _ls_own(planes: np.ndarray, version: int, c: int) -> np.ndarray:
    """[n + 1] int16: plane c's (in coding order) least-squares sub-predictions at every pixel, as an
    analysis with least squares makes them (_State.own's column 7; they read the pixels only):
    _analysis's other process makes the last plane's first."""
    lay = _layout(*planes.shape[1:])
    flat, st = _known_state(planes, lay, version, ls=1)
    out = np.zeros(lay.n + 1, dtype=np.int16)
    for idx in np.array_split(np.arange(lay.n), max(1, lay.n // _CHUNK)):
        out[idx] = _ls_predict(st, c, idx)
    return out


def _needs_diff(planes: np.ndarray, version: int) -> bool:
    """Whether an analysis of these planes makes the difference mode's plans: version 3 on, and a plane
    after the first in coding order that is not constant."""
    order = _order(planes.shape[0], version)
    if version < 3 or len(order) < 2:
        return False
    rest = planes[order[1:]].reshape(len(order) - 1, -1)
    return bool((rest != rest[:, :1]).any())


# An encoder's analysis runs its first least-squares option in a second process (0.9.27; below the
# highest effort, which tries one option, the difference mode's plans: 0.10.3) on images of at least
# this many pixels (below, starting the process costs more than it saves), where this
# is the user's process and it may use two cores: seed_codec.jobs >= 2, or by default where
# processes fork (Linux) or the program allows spawn (workers.parallel_by_default: sfcodec), there
# are two usable cores and the available memory holds ANALYSIS_BYTES_PER_PIXEL more.
PARALLEL_MIN_PIXELS = 1 << 16
ANALYSIS_BYTES_PER_PIXEL = 1024
_JOBS: contextvars.ContextVar["int | None"] = contextvars.ContextVar("seed_codec_jobs", default=None)


@contextlib.contextmanager
def jobs(n: int | None):
    """Within this scope the encoder's analysis uses at most n processes (1: this one only; None:
    as the machine allows). The bytes are the same whatever it is."""
    token = _JOBS.set(n)
    try:
        yield
    finally:
        _JOBS.reset(token)


# The encoder's effort (0.10.3): how many of the stream's modes it tries. The decoder reads the
# chosen modes from the stream, so a file of any effort decodes wherever its version does, and the
# modes left out are the ones that cost the decoder the most time. 3 (the default): every
# least-squares mode (off, on, boosted) and every mode of the channels after the first (the blend,
# the difference mode, the mixed mode); 2: no least-squares predictor; 1: nor the mixed mode.
EFFORTS = (1, 2, 3)
MAX_EFFORT = 3
_EFFORT: contextvars.ContextVar[int] = contextvars.ContextVar("seed_codec_effort", default=MAX_EFFORT)


def check_effort(level: int | None) -> int:
    """The effort `level` names (None: the default, MAX_EFFORT); ValueError for another value."""
    if level is None:
        return MAX_EFFORT
    if isinstance(level, bool) or level not in EFFORTS:
        raise ValueError(f"seed codec: unknown effort {level!r} (expected one of {EFFORTS})")
    return int(level)


@contextlib.contextmanager
def effort(level: int | None):
    """Within this scope the encoder tries the modes of effort `level` (EFFORTS; None: MAX_EFFORT)."""
    token = _EFFORT.set(check_effort(level))
    try:
        yield
    finally:
        _EFFORT.reset(token)


def current_effort() -> int:
    """The scope's effort (MAX_EFFORT outside any effort() scope)."""
    return _EFFORT.get()


def _in_parallel(lay: _Layout, version: int, diff: bool = True) -> bool:
    """Whether _analysis gives a second process work: the first least-squares option where the effort
    tries several, else (diff: the analysis makes them) the difference mode's plans."""
    work = len(_ls_candidates(version)) > 1 or diff and version >= 3

    def by_default() -> bool:
        mem = workers.available_memory()
        return (workers.parallel_by_default() and workers.usable_cores() >= 2
                and (mem is None or mem >= ANALYSIS_BYTES_PER_PIXEL * lay.n))

    return work and _second_process(lay, by_default)


def _second_process(lay: _Layout, by_default) -> bool:
    """Whether the user's process (a worker starts none) takes a second one for an image of
    PARALLEL_MIN_PIXELS or more: seed_codec.jobs >= 2 where set, else by_default() (the machine's say):
    the rule of _in_parallel and _companion_starts."""
    if lay.n < PARALLEL_MIN_PIXELS or not workers.in_main_process():
        return False
    n = _JOBS.get()
    return n >= 2 if n is not None else by_default()


def _companion_starts(lay: _Layout, ls: int) -> bool:
    """Whether a decoder has a companion process (_Companion): with least squares (ls; without them what
    it would take over is about a tenth of the decode, and on 2 cores it saved nothing measurable:
    RESULTS.md, 0.10.4), on images of PARALLEL_MIN_PIXELS or more, where this is the user's process and
    processes fork (Linux), with seed_codec.jobs >= 2 or by default two usable cores."""
    return bool(ls) and workers.forks() and _second_process(lay, lambda: workers.usable_cores() >= 2)


class _Ahead(NamedTuple):
    """What the decoder needs of a channel in a wavefront that reads earlier wavefronts only: the
    least-squares fits (_ls_fit; None without least squares), the blend's weights and their sums
    (_blend_weights), the mixed mode's weights (_mix_weight; None in another mode)."""
    ls: np.ndarray | None
    blend: tuple
    mix: np.ndarray | None


def _ahead(st, c: int, idx: np.ndarray, mixed: bool) -> _Ahead:
    """_Ahead of channel c at wavefront idx, from the state's tables (st: a _State, or the companion's
    view of one)."""
    return _Ahead(None if st.feat is None else _ls_fit(st, c, idx), _blend_weights(st, c, idx),
                  _mix_weight(st.mixd[c][_mix_rows(st, idx)].sum(axis=1)) if mixed else None)


class _Companion:
    """The decoder's companion process (0.10.4): it makes each wavefront's _Ahead a step before the
    decoder needs it, the decoder doing everything else.

    What _ahead reads lies in earlier wavefronts only, so while this process decodes channel c of
    wavefront t, the companion can make channel c + 1's of wavefront t (or channel 0's of t + 1): it
    waits (semaphore `done[c]`) until this process has recorded channel c of the wavefront before,
    makes c's for the next from the state's tables (the least-squares table, the blend's errors, the
    mixed mode's codelengths: in memory shared since before the fork), writes them to shared buffers
    and says so (`ready[c]`), which this process waits for before it predicts. The same operations on
    the same integers: the same pixels. The fits are about a third of a photograph's decode with least
    squares (kodim01: 5.9 of 16.0 s), the weights most of a tenth. Should the companion end early
    (killed), this process makes the rest itself."""

    def __init__(self, st: _State, mixed: list[bool]):
        c_, lay = len(st.x), st.lay
        width = max(len(s) for s in lay.steps)
        zeros = workers.shared_zeros
        self.mixed = mixed
        self.ls = [None if st.feat is None else zeros((_ls_dims(c, st.version), width), np.float64) for c in range(c_)]
        self.wt = [zeros((width, st.err_sub[c].shape[1]), np.int64) for c in range(c_)]
        self.tot = [zeros((width,), np.int64) for _ in range(c_)]
        self.mix = [zeros((width,), _MIX_W.dtype) if mixed[c] else None for c in range(c_)]
        self.ready = [workers.semaphore() for _ in range(c_)]
        self.done = [workers.semaphore() for _ in range(c_)]
        view = types.SimpleNamespace(lay=lay, version=st.version, ls=st.ls, feat=st.feat, err_sub=st.err_sub,
                                     mixd=st.mixd, window_rows=None, mix_rows=None)
        self.proc = workers.companion(_run_ahead, self, view)
        self.alone = False  # the companion is gone: everything made here

    @classmethod
    @contextlib.contextmanager
    def run(cls, st: _State, start: bool, mixed: list[bool]):
        """Within the scope st has a companion where `start` (st made with shared=True); it stops on
        leaving the scope."""
        if not start:
            yield
            return
        st.companion = comp = cls(st, mixed)
        try:
            yield
        except BaseException:  # Ctrl-C, an error: it stops at once
            workers.stop(comp.proc)
            raise
        else:  # the decode is done, and so is its work: it ends on its own
            workers.stop(comp.proc, wait=5.0)
        finally:
            st.companion = None

    def get(self, st: _State, c: int, idx: np.ndarray) -> _Ahead:
        """Channel c's _Ahead at wavefront idx: the companion's, or made here once it is gone."""
        if not self.alone:
            if workers.acquire(self.ready[c], self.proc):
                n = len(idx)
                return _Ahead(None if self.ls[c] is None else self.ls[c][:, :n], (self.wt[c][:n], self.tot[c][:n]),
                              None if self.mix[c] is None else self.mix[c][:n])
            self.alone = True
        return _ahead(st, c, idx, self.mixed[c])

    def recorded(self, c: int) -> None:
        """Channel c of the wavefront is recorded: the companion may make its next."""
        if not self.alone:
            self.done[c].release()

    def put(self, c: int, n: int, got: _Ahead) -> None:
        """In the companion: channel c's _Ahead of a wavefront of n pixels into the shared buffers."""
        if got.ls is not None:
            self.ls[c][:, :n] = got.ls
        self.wt[c][:n], self.tot[c][:n] = got.blend
        if got.mix is not None:
            self.mix[c][:n] = got.mix
        self.ready[c].release()


def _run_ahead(comp: _Companion, view) -> None:
    """The companion process: every wavefront's _Ahead in the decoder's order, each once the decoder
    has recorded the same channel of the wavefront before."""
    for k, idx in enumerate(view.lay.steps):
        for c in range(len(comp.mixed)):
            if k and not workers.acquire_in_companion(comp.done[c]):
                return
            comp.put(c, len(idx), _ahead(view, c, idx, comp.mixed[c]))


def _key(planes: np.ndarray, version: int) -> tuple:
    """The key of planes' analysis in shared_analyses()'s store (at the scope's effort: its modes)."""
    return (version, _EFFORT.get(), planes.shape, planes.dtype.str,
            hashlib.blake2b(np.ascontiguousarray(planes).data, digest_size=16).digest())


class _Store:
    """shared_analyses()'s analyses by key, with their memory: at most SHARED_BYTES, the oldest out
    first (a scope over many images keeps the last ones; the last one always). And, never dropped,
    the pixel bits of the modes chosen for every planes coded whole (8 bytes a pixel: seed_pixel_bits
    of a large image's blocks after its file, without analysing them again)."""

    def __init__(self):
        self.items: dict = {}
        self.bytes = 0
        self.pixel_bits: dict = {}

    def put(self, key, options: list[_Option]) -> None:
        n = _nbytes(options)
        self.items[key] = (options, n)
        self.bytes += n
        while self.bytes > SHARED_BYTES and len(self.items) > 1:
            self.bytes -= self.items.pop(next(iter(self.items)))[1]


def _nbytes(options: list[_Option]) -> int:
    """The memory of an analysis: its arrays, each once (the options share the difference mode's
    plans, and the priors are shared by every analysis: not counted)."""
    arrays = {id(o.flat): o.flat for o in options}  # the options share one (since 0.9.18)
    for o in options:
        for e in o.planes:
            for pv in (e or ()):
                if pv is not None:
                    v, plan = pv
                    for a in (v, getattr(plan, "weights", None)) + tuple(
                            a for pl in _plan_parts(plan)
                            for a in (pl.rows, pl.centres, pl.signs, pl.coarse, pl.cost)
                            + tuple(pl.run.arrays() if pl.run is not None else ())):
                        if a is not None:
                            arrays[id(a)] = a
    return sum(a.nbytes for a in arrays.values())


@contextlib.contextmanager
def shared_analyses():
    """Within this scope, an image's analysis (_analysis) is made once and reused by every push,
    pixel-bits and size call on the same planes (compress: the fallback file, the seed tiles' shares
    and the in-context push of one photograph). The bytes are the same with or without it."""
    token = _SHARED.set(_Store() if _SHARED.get() is None else _SHARED.get())
    try:
        yield
    finally:
        _SHARED.reset(token)


def _choose(planes: np.ndarray, lay: _Layout, version: int, coded: np.ndarray | None = None):
    """(the least-squares mode (0 off; truthy: on), the planes in coding order, a _Plan per plane
    (None: constant), predicted bits, [n] bits of each pixel over its planes). Version 2 codes the
    image with and without least squares and keeps the smaller (one flag): it gains on photographs
    (Kodak -1.4%) and loses on two-level images (sparse dots +85%); version 6 also tries it boosted
    (_ls_modes; one of three). Version 3 also codes each channel after the first in the difference
    mode and keeps the smaller per channel (one flag each); version 7 also in the mixed mode
    (_Mix; one of three each).
    coded (bool [n], seed_push_known): only those pixels are coded; the choices and the predicted
    bits are theirs (the pixel bits are every pixel's)."""
    best = None
    total = (lambda v: float(v.sum())) if coded is None else (lambda v: float(v[coded].sum()))
    for opt in _analysis(planes, lay, version):
        plans, bits, pixel = [], _ls_mode_bits(version), np.zeros(lay.n)
        for c, entry in enumerate(opt.planes):
            bits += 1.0
            if entry is None:
                plans.append(None)
                bits += 8.0
                continue
            (v, plan), *others = entry
            b = total(v)
            if others[0] is not None:
                bits += _plane_mode_bits(version)
                for alt in others:
                    if alt is not None and total(alt[0]) < b:
                        v, plan = alt
                        b = total(v)
            plans.append(plan)
            bits += b
            pixel += v
        if best is None or bits < best[3]:
            best = (opt.ls, opt.flat, plans, bits, pixel)
    store = _SHARED.get()
    if store is not None and coded is None:
        store.pixel_bits[_key(planes, version)] = best[4]
    return best


# --- version 5: the LZMA mode ----------------------------------------------------------------
LZ_MIN_DICT, LZ_MAX_DICT = 1 << 12, 1 << 26


def _lz_filters(n_bytes: int) -> list[dict]:
    """Raw LZMA2 for n_bytes of planes: the dictionary follows from the shape, so the decoder has it."""
    d = min(max(LZ_MIN_DICT, 1 << max(0, n_bytes - 1).bit_length()), LZ_MAX_DICT)
    return [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": d, "lc": 4, "lp": 0, "pb": 0}]


def _lz_bound(n_bytes: int) -> int:
    """The largest compressed size the LZMA mode codes (the count is uniform on 0 .. this): far above
    what raw LZMA2 makes of n_bytes (n_bytes plus about 3 bytes per 64 KiB chunk plus 1)."""
    return n_bytes + n_bytes // 1024 + 64


def _lz_bytes(planes: np.ndarray) -> bytes:
    raw = np.ascontiguousarray(np.moveaxis(planes, 0, -1)).tobytes()
    return lzma.compress(raw, format=lzma.FORMAT_RAW, filters=_lz_filters(len(raw)))


def _lz_bits(n_comp: int, n_bytes: int) -> float:
    """Bits of the LZMA mode's coding (its flag not included)."""
    return 8.0 * n_comp + float(np.log2(_lz_bound(n_bytes) + 1))


def _lz_mode(planes: np.ndarray, bits: float) -> tuple[bytes | None, float]:
    """Version 5's choice: (the LZMA mode's bytes where smaller than version 4's `bits`, else None;
    the call's total bits, its mode flag included)."""
    comp = _lz_bytes(planes)
    lz_bits = _lz_bits(len(comp), planes.size)
    return (comp, 1.0 + lz_bits) if lz_bits < bits else (None, 1.0 + bits)


def _lz_pop(m: Message, shape: tuple[int, int, int]) -> np.ndarray:
    """The LZMA mode's planes from the stack. Garbage gives some planes (zeros where the bytes do
    not decompress to exactly the shape's size), never an exception: the caller's CRC catches it."""
    c_, h, w = shape
    n = c_ * h * w
    k = int(uniform(_lz_bound(n) + 1, ()).pop(m))
    comp = uniform(256, (k,)).pop(m).astype(np.uint8).tobytes() if k else b""
    try:
        dec = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_lz_filters(n))
        raw = dec.decompress(comp, max_length=n + 1)
    except lzma.LZMAError:
        raw = b""
    if len(raw) != n:
        return np.zeros(shape, dtype=np.uint8)
    return np.ascontiguousarray(np.moveaxis(np.frombuffer(raw, dtype=np.uint8).reshape(h, w, c_), -1, 0))


def _check_version(version: int) -> int:
    if version not in VERSIONS:
        raise ValueError(f"seed codec: unknown version {version!r} (this release has {VERSIONS})")
    return int(version)


def _check_planes(planes: np.ndarray) -> np.ndarray:
    planes = np.asarray(planes)
    _check_shape(planes.shape)
    if planes.dtype != np.uint8:
        raise ValueError(f"seed codec: expected uint8 planes, got {planes.dtype}")
    return planes


def _check_coded(coded: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    coded = np.asarray(coded)
    if coded.dtype != bool or coded.shape != tuple(shape[1:]):
        raise ValueError(f"seed codec: expected a bool mask {tuple(shape[1:])}, got {coded.dtype} {coded.shape}")
    return coded.reshape(-1)


def _plan_parts(plan) -> tuple:
    """The histogram plans of a plane's plan: a _Mix's two, a _Plan itself, none for a constant plane."""
    return () if plan is None else (plan.blend, plan.other) if isinstance(plan, _Mix) else (plan,)


def _last_counts(lay: _Layout, x: np.ndarray, pl: _Plan) -> tuple[_Counts, dict]:
    """A plan's counts after the last wavefront and its halvings, wavefront -> (rows, their counts
    before), which the pusher rewinds: those the analysis ran, where it left them (_Run.take), else run
    here on the plane's pixels x."""
    got = None if pl.run is None else pl.run.take()
    if got is not None:
        return got, pl.run.halved
    cc, log = pl.counts(), {}
    if cc.halve_at is None:  # the counts after the last wavefront, at once
        cc.add(pl.rows, pl.coarse, _slot(x, pl.centres, pl.signs), INC)
        return cc, log
    for k, idx in enumerate(lay.steps):  # version 6's rows halve as they fill: logging each halving
        cc.add(pl.rows[idx], None if pl.coarse is None else pl.coarse[idx],
               _slot(x[idx], pl.centres[idx], pl.signs[idx]), INC)
        event = cc.settle(pl.rows[idx])
        if event is not None:
            log[k] = event
    return cc, log


def _push_plans(m: Message, lay: _Layout, flat: np.ndarray, plans: list, ls: int, version: int,
                coded: np.ndarray | None = None) -> None:
    """Push the pixels (those where `coded`, default all) of planes in coding order with their plans,
    then the plane flags: everything after the LZMA mode's flag, which _pop_plans pops."""
    c_ = len(flat)
    # per plane its plans (two in the mixed mode), their counts after the last wavefront and halvings
    parts = [_plan_parts(pl) for pl in plans]
    last = [[_last_counts(lay, flat[c], pl) for pl in parts[c]] for c in range(c_)]
    # A stack: push the last wavefront first; rewind each histogram to its state before it.
    for k in reversed(range(len(lay.steps))):
        idx = lay.steps[k]
        sel = None if coded is None else coded[idx]
        for c in reversed(range(c_)):
            if plans[c] is None:
                continue
            x = flat[c][idx]
            keep = slice(None) if sel is None else sel
            tables = []
            for pl, (cc, log) in zip(parts[c], last[c]):
                b, p, sg = pl.rows[idx], pl.centres[idx], pl.signs[idx]
                cb = None if pl.coarse is None else pl.coarse[idx]
                if k in log:  # undo the halving after this wavefront's add
                    cc.restore(*log[k])
                cc.add(b, cb, _slot(x, p, sg), -INC)
                if sel is None or sel.any():
                    tables.append(cc.tables(b[keep], None if cb is None else cb[keep], p[keep], sg[keep]))
            if not tables:
                continue
            t = tables[0] if len(tables) == 1 else _mix_tables(*tables, plans[c].weights[idx][keep])[0]
            _push(m, x[keep], _CATEGORICAL, t)
    if version >= 3:  # the modes of the coded channels after the first
        for c in reversed(range(1, c_)):
            if plans[c] is not None:
                (_MODE3 if version >= 7 else _FLAG).push(m, np.int64(plans[c].mode))
    for c in reversed(range(c_)):
        if plans[c] is None:
            _BYTE.push(m, np.int64(flat[c][0]))
        _FLAG.push(m, np.int64(plans[c] is None))
    if version >= 2:
        _ls_mode_codec(version).push(m, np.int64(ls))


def _pop_plans(m: Message, lay: _Layout, c_: int, version: int, known: np.ndarray | None = None,
               coded: np.ndarray | None = None) -> np.ndarray:
    """What _push_plans pushed: [C, n] planes in coding order. With `coded`, only those pixels come
    from the stack; the others are `known` ([C, n] in coding order), which the decoder has."""
    ls = int(_ls_mode_codec(version).pop(m)) if version >= 2 else 0
    const: list[int | None] = []  # the value of each constant plane, None if coded
    for _ in range(c_):
        const.append(int(_BYTE.pop(m)) if int(_FLAG.pop(m)) else None)
    mode = [0] * c_  # version 3: channels in the difference mode (1); version 7: or the mixed mode (2)
    if version >= 3:
        for c in range(1, c_):
            mode[c] = int((_MODE3 if version >= 7 else _FLAG).pop(m)) if const[c] is None else 0
    ahead = _companion_starts(lay, ls)
    st = _State(lay, c_, version, ls, shared=ahead)
    for c in range(c_):
        if mode[c] == 2:
            st.mixd[c] = st.zeros(lay.n + 1, dtype=np.int64)
    with _Companion.run(st, ahead, [k == 2 for k in mode]):
        return _pop_pixels(m, st, c_, version, const, mode, known, coded)


def _pop_pixels(m: Message, st: _State, c_: int, version: int, const: list, mode: list,
                known: np.ndarray | None, coded: np.ndarray | None) -> np.ndarray:
    """_pop_plans' pixels, after its flags and modes: [C, n] planes in coding order."""
    lay = st.lay
    bias = _Bias(c_) if version >= 2 else None
    cascade = _Cascade(c_) if version >= 8 else None
    coarse = version >= 4  # version 4's difference mode: fine and coarse rows
    # per channel its counts: the blend's (mode 0 and 2), the difference mode's (1 and 2)
    counts = [([_Counts(_prior()[min(c, 1)], halve_at=_blend_halve(version))] if mode[c] != 1 else [])
              + ([_Counts(*_diff_priors(version), halve_at=_diff_halve(version))] if mode[c] else [])
              for c in range(c_)]
    for idx in lay.steps:
        sel = None if coded is None else coded[idx]
        for c in range(c_):
            got = None if st.companion is None else st.companion.get(st, c, idx)  # _Ahead
            p = st.inputs(c, idx, None if got is None else got.ls)
            pred = st.blend(c, idx, p, None if got is None else got.blend)
            # the difference mode's prediction: for this channel's pixels, or the next one's contexts
            dc = _diff_centre(st, c, idx) if mode[c] or (0 < c < c_ - 1 and mode[c + 1]) else None
            if const[c] is not None:
                x = np.full(len(idx), const[c], dtype=np.int64)
            else:  # per plan (the channel's mode's one or two) the histogram row, centre and sign of each pixel
                biased = bias is not None and mode[c] != 1
                coding = []  # (rows, coarse rows, centres, signs) per plan, as counts[c]
                if mode[c] != 1:
                    bb = st.bins(c, idx)
                    corrected = pred
                    if biased:
                        ctx = _Bias.context(st, c, idx, pred, bb)
                        corrected = bias.correct(c, ctx, pred)
                    if cascade is not None:
                        v = _Cascade.features(st, c, idx)
                        corrected = cascade.correct(c, bb, v, corrected)
                    coding.append((bb, None, *_centre(corrected, version)))
                if mode[c]:
                    pr, d = dc
                    b = _diff_context(st, c, idx, d)
                    coding.append((b, _diff_coarse(b, d) if coarse else None, pr, np.ones_like(pr)))
                mixed = mode[c] == 2
                if mixed:  # every pixel's tables: their costs weigh the pixels after them
                    tb, td = (cc.tables(*k) for cc, k in zip(counts[c], coding))
                    w = _mix_weight(st.mixd[c][_mix_rows(st, idx)].sum(axis=1)) if got is None else got.mix
                    t, sb, sd = _mix_tables(tb, td, w)
                if sel is None:
                    x = _pop(m, len(idx), _CATEGORICAL, t if mixed else counts[c][0].tables(*coding[0]))
                else:
                    x = known[c][idx].astype(np.int64)
                    if sel.any():
                        x[sel] = _pop(m, int(sel.sum()), _CATEGORICAL, t[sel] if mixed else counts[c][0].tables(
                            *(None if a is None else a[sel] for a in coding[0])))
                if mixed:
                    r = np.arange(len(idx))
                    st.mixd[c][idx] = _cost64(tb[r, x], sb) - _cost64(td[r, x], sd)  # exact integers in float64
                for cc, (b, cb, pr, sg) in zip(counts[c], coding):
                    cc.add(b, cb, _slot(x, pr, sg), INC)
                    cc.settle(b)
                if biased:
                    bias.update(c, ctx, x, pred)
                if cascade is not None and mode[c] != 1:
                    cascade.update(c, bb, v, x, corrected)
            st.record(c, idx, x, p, pred)
            if dc is not None:
                st.dres[c][idx] = x - dc[0]
    return np.stack([st.x[c][: lay.n] for c in range(c_)])


def seed_push(m: Message, planes: np.ndarray, version: int = LATEST) -> float:
    """Push uint8 planes [C, H, W] with `seed_codec(planes.shape, version)`; returns the predicted
    size in bits (seed_bits), which the encoder has computed anyway: callers that need both do not
    analyse the planes twice."""
    planes = _check_planes(planes)
    lay = _layout(*planes.shape[1:])
    version = _check_version(version)
    ls, flat, plans, bits, _ = _choose(planes, lay, version)
    if version >= 5:
        comp, bits = _lz_mode(planes, bits)
        if comp is not None:  # the LZMA mode: its bytes, their count, then the flag (popped first)
            if comp:
                uniform(256, (len(comp),)).push(m, np.frombuffer(comp, dtype=np.uint8).astype(np.int64))
            uniform(_lz_bound(planes.size) + 1, ()).push(m, np.int64(len(comp)))
            _FLAG.push(m, np.int64(1))
            return bits
    _push_plans(m, lay, flat, plans, ls, version)
    if version >= 5:
        _FLAG.push(m, np.int64(0))  # its bit is in `bits` already (_lz_mode)
    return bits


def seed_codec(shape: tuple[int, int, int], version: int = LATEST) -> Codec:
    """Codec of uint8 planes [C, H, W] (1 <= C <= 4); deterministic, no initial bits needed.
    `version` 1 is the codec of files that name none; both stay decodable."""
    c_, h, w = _check_shape(shape)
    version = _check_version(version)
    lay = _layout(h, w)
    order = _order(c_, version)

    def push(m: Message, planes: np.ndarray) -> None:
        planes = np.asarray(planes)
        if planes.shape != (c_, h, w) or planes.dtype != np.uint8:
            raise ValueError(
                f"seed codec: expected uint8 {(c_, h, w)}, got {planes.dtype} {planes.shape}"
            )
        seed_push(m, planes, version)

    def pop(m: Message) -> np.ndarray:
        if version >= 5 and int(_FLAG.pop(m)):
            return _lz_pop(m, (c_, h, w))
        out = np.empty((c_, lay.n), dtype=np.uint8)
        out[order] = _pop_plans(m, lay, c_, version)
        return out.reshape(c_, h, w)

    return Codec(push, pop)


def seed_pixel_bits(planes: np.ndarray, version: int = LATEST) -> np.ndarray:
    """[H, W] float64: the bits of each pixel (its planes together) when the seed codec codes the whole
    image, the modes chosen for all of it (no LZMA mode). What a region costs through seed_push_known:
    the counts learn from every pixel, coded or known, so a pixel's bits do not depend on which
    others are coded (only the modes may change with the region, and only where that saves bits)."""
    planes = _check_planes(planes)
    version = _check_version(version)
    store = _SHARED.get()
    known = None if store is None else store.pixel_bits.get(_key(planes, version))
    if known is None:
        known = _choose(planes, _layout(*planes.shape[1:]), version)[4]
    return known.reshape(planes.shape[1:]).copy()


def sharing() -> bool:
    """Whether a shared_analyses() scope is active (its store keeps pixel bits: remember_pixel_bits)."""
    return _SHARED.get() is not None


def remember_pixel_bits(planes: np.ndarray, version: int, bits: np.ndarray) -> None:
    """Within shared_analyses(), keep seed_pixel_bits(planes, version) = bits ([H, W] float64), made
    elsewhere (a worker process that coded the planes: stream's parts), so it is not made again."""
    store = _SHARED.get()
    if store is not None:
        store.pixel_bits[_key(_check_planes(planes), _check_version(version))] = np.asarray(bits, np.float64).ravel()


def seed_push_known(m: Message, planes: np.ndarray, coded: np.ndarray, version: int = LATEST) -> float:
    """Push the pixels of uint8 planes [C, H, W] where `coded` (bool [H, W]), for a decoder that knows
    all the others (seed_pop_known): the seed codec over the whole image, its causal context and
    adaptive counts running through every pixel, coded or known. Modes (least squares, difference
    mode, constant planes) as seed_push chooses them, for the coded pixels' bits; no LZMA mode.
    Returns the predicted bits."""
    planes = _check_planes(planes)
    flat_coded = _check_coded(coded, planes.shape)
    lay = _layout(*planes.shape[1:])
    version = _check_version(version)
    ls, flat, plans, bits, _ = _choose(planes, lay, version, flat_coded)
    _push_plans(m, lay, flat, plans, ls, version, flat_coded)
    return bits


def seed_pop_known(m: Message, known: np.ndarray, coded: np.ndarray, version: int = LATEST) -> np.ndarray:
    """The planes seed_push_known pushed: `known` (uint8 [C, H, W]) where not `coded`, the stack's
    pixels where coded."""
    known = _check_planes(known)
    c_, h, w = known.shape
    flat_coded = _check_coded(coded, known.shape)
    version = _check_version(version)
    order = _order(c_, version)
    kflat = known[order].reshape(c_, -1)
    out = np.empty((c_, h * w), dtype=np.uint8)
    out[order] = _pop_plans(m, _layout(h, w), c_, version, kflat, flat_coded)
    return out.reshape(c_, h, w)


def seed_bits(planes: np.ndarray, version: int = LATEST) -> float:
    """Predicted size in bits of `seed_codec(planes.shape, version)` on planes (float64 model; the
    LZMA mode's size is exact)."""
    planes = np.asarray(planes)
    c_, h, w = _check_shape(planes.shape)
    version = _check_version(version)
    bits = _choose(planes, _layout(h, w), version)[3]
    return _lz_mode(planes, bits)[1] if version >= 5 else bits


def calibrate(images: np.ndarray, version: int = 1) -> np.ndarray:
    """Mean |residual| per (channel class, bin) over uint8 images [N, H, W, C]; THETA's source."""
    s = np.zeros((2, N_BINS))
    cnt = np.zeros((2, N_BINS))
    for img in images:
        planes = np.moveaxis(img, -1, 0)
        lay = _layout(*planes.shape[1:])
        flat, bins, centres, signs, _ = _analyse(planes, lay, version)
        for c in range(planes.shape[0]):
            np.add.at(s[min(c, 1)], bins[c], np.abs(flat[c] - centres[c]))
            np.add.at(cnt[min(c, 1)], bins[c], 1)
    return s / np.maximum(cnt, 1)


def theta_table(mean_abs: np.ndarray) -> np.ndarray:
    """THETA from `calibrate`'s output: round(2**16 exp(-1 / s))."""
    s = np.maximum(mean_abs, 0.15)  # a floor: never rule out nonzero residuals entirely
    return np.rint(65536 * np.exp(-1.0 / s)).astype(np.int64)

