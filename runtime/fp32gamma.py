"""lgamma and digamma of the machine (isa/spec_intro.md, Numerics) as fixed fp32 sequences on the backend interface of
runtime/ops_numpy.py, like runtime/fp32math.py (whose conventions they share).

Both work on a = |x|. Near 0 a series: lgamma(x) = x Q(x) - log a, digamma(x) = psi(1 + a) - 1/a. On [1/2, 8) four
pieces m P(a - c), where m = prod (a - zero) over the zeros of the function near the piece (lgamma's at 1 and 2,
digamma's x0 = 1.4616..., an fp32 pair), exact or nearly so, keeps the relative error small at the zeros; P's constant
term is an fp32 pair and m times its head an exact (Dekker) product. From 8 the asymptotic expansions, with log a as an
fp32 pair. Below 0 the reflection formulas in r = |a - rint(a)|, which is exact: lgamma(x) = -(lgamma(a) + log a +
log r + log(sin(pi r) / (pi r))), digamma(x) = psi(1 + a) + pi cot(pi a).

Every table was fitted with numpy (least squares on Chebyshev nodes with Lawson reweighting, i.e. near-minimax in
the relative error, against mpmath), its coefficients rounded to fp32 one at a time with the rest refitted; the
approximation error of the rounded table is noted with it. Measured errors against float64, on every fp32 in
[2^-8, 2^10) and in (-32, -1/2] and on grids beyond: lgamma 1.9 ulp and digamma 1.7 ulp for x > 0 (eager's float
lgamma 0.84, digamma 103 where |psi| > 0.1 and 2.6e7 at x0); below 0, where the reflection's two terms cancel near
the functions' negative zeros, 3.2 and 4.4 ulps of the larger term (eager's 1.05 and 208).
"""
from __future__ import annotations

from trnc.runtime.fp32pow import _fast_two_sum, _log2_pair, _two_prod
from trnc.runtime.fp32special import LN2, LN2_LO
from trnc.runtime.fp32trig import _two_sum
from trnc.runtime.fp32util import INF, copysign, fabs, float_max, float_min, horner, horner_values, no_nan

NAN = float("nan")
HALF_LOG_2PI = 0.9189385332046727          # log(2 pi) / 2
FAR = 8.0                                  # the asymptotic expansions from here
SMALL = 0.5                                # the series about 0 below here
SPLIT_MAX = 2.0 ** 64                      # Dekker's product splits without overflow below
# lgamma(1 + x) / x on [0, 1/2] and on [-1/2, 0], degree 10: 1.2e-8 relative (x Q(x) is under half of lgamma).
LG_SMALL_POS = (-0.5772156715393066, 0.8224679231643677, -0.40072157979011536, 0.2712548077106476,
                -0.2143864929676056, 0.21349495649337769, -0.31737378239631653, 0.5570716857910156,
                -0.7651543617248535, 0.6352393627166748, -0.23220007121562958)
LG_SMALL_NEG = (-0.5772156715393066, 0.8224658966064453, -0.4007434844970703, 0.2692279815673828,
                -0.22481487691402435, 0.034004878252744675, -0.8096303939819336, -1.9624013900756836,
                -4.203672885894775, -4.538373947143555, -2.5113751888275146)
# lgamma(a) = (a - 1)(a - 2) P(a - center) on [1/2, 5/4) and [5/4, 11/4), (a - 2) P(a - center) on [11/4, 9/2) and
# [9/2, 8), degree 11: 2.2e-9, 6.0e-10, 5.1e-10 and 3.4e-10 relative.
LG_LOWS = (0.5, 1.25, 2.75, 4.5)
LG_CENTERS = (0.875, 2.0, 3.5, 6.25)
ONE, TWO = (1.0, 0.0), (2.0, 0.0)
LG_ZEROS = ((ONE, TWO), (ONE, TWO), (TWO,), (TWO,))
LG_PIECES = (
    ((0.6105508208274841, -1.5126650154684285e-08), -0.2903364300727844, 0.2090609222650528, -0.17656628787517548,
     0.16129721701145172, -0.15417413413524628, 0.1533353179693222, -0.1551172286272049, 0.13688597083091736,
     -0.13419689238071442, 0.2764042913913727, -0.3084375560283661),
    ((0.42278432846069336, 6.442847144683128e-09), -0.10031729936599731, 0.03296501934528351, -0.012384256348013878,
     0.004998230841010809, -0.0021074919495731592, 0.0009186407551169395, -0.00040882002213038504,
     0.00017120217671617866, -7.52136402297765e-05, 5.542903090827167e-05, -2.7297628548694775e-05),
    ((0.8006490468978882, 2.1333754318675346e-08), 0.20167171955108643, -0.024328557774424553, 0.004196264315396547,
     -0.000844631518702954, 0.00018595521396491677, -4.3061318137915805e-05, 8.868547411111649e-06,
     -2.1638238649757113e-06, 1.9937872366426745e-06, -5.714173880733142e-07, -2.5593493546693935e-07),
    ((1.2281421422958374, -2.770455154177398e-08), 0.12289680540561676, -0.008507573045790195,
     0.0008244740311056376, -9.237903577741235e-05, 1.126270399254281e-05, -1.4395189964488964e-06,
     1.7218484060776973e-07, -2.6712234202364016e-08, 9.758664987202792e-09, -4.936159814228347e-10,
     -6.119439399654425e-10),
)
# Stirling: lgamma(a) = (a - 1/2) log a - a + log(2 pi) / 2 + W(1/a^2) / a for a >= 8, degree 3: 3e-8 relative
# (of W: under 2^-40 of lgamma).
LG_FAR = (0.0833333358168602, -0.0027777771465480328, 0.0007934303721413016, -0.0005710276309400797)
# digamma: psi(1 + a) = (a - (x0 - 1)) P(a - 1/2) on [0, 1], degree 11: 1.0e-9 relative.
DG_SMALL = ((0.9510558843612671, -8.936859252628437e-09), -0.42362740635871887, 0.24054260551929474,
            -0.14840589463710785, 0.09498292952775955, -0.0619022436439991, 0.04086780920624733,
            -0.027170827612280846, 0.017036573961377144, -0.010894376784563065, 0.011027002707123756,
            -0.007913327775895596)
# psi(a) = (a - x0) P(a - center) on [1/2, 1) and [1, 2), P(a - center) on [2, 4) and [4, 8), degree 11:
# 9.0e-10, 7.6e-10, 1.0e-9 and 7.6e-10 relative.
X0 = (1.4616321325302124, 1.243815006546356e-08)   # the positive zero of psi as an fp32 pair
DG_LOWS = (0.5, 1.0, 2.0, 4.0)
DG_CENTERS = (0.75, X0[0], 3.0, 6.0)
DG_ZEROS = ((X0,), (X0,), (), ())
DG_PIECES = (
    ((1.5258738994598389, -5.2131532868315844e-08), -1.427712082862854, 1.719435214996338, -2.2124502658843994,
     2.909853458404541, -3.8588013648986816, 5.1497578620910645, -6.858767032623291, 8.624627113342285,
     -11.494804382324219, 22.839515686035156, -30.546586990356445),
    ((0.9676722288131714, 2.1712187603384336e-08), -0.44276317954063416, 0.2584998905658722, -0.1639421135187149,
     0.10781794786453247, -0.0722169503569603, 0.04891922324895859, -0.03298754245042801, 0.02161012962460518,
     -0.01598411425948143, 0.014378594234585762, -0.007682690396904945),
    ((0.9227843284606934, 7.041252914063989e-09), 0.3949340581893921, -0.07705692946910858, 0.01982339657843113,
     -0.005677449516952038, 0.0017171722138300538, -0.0005381234223023057, 0.00017324762302450836,
     -5.262158083496615e-05, 1.5507270290981978e-05, -8.209014595195185e-06, 3.2851187370397383e-06),
    ((1.7061176300048828, 3.867485531827697e-08), 0.18132296204566956, -0.01639486849308014, 0.0019712778739631176,
     -0.00026596017414703965, 3.8210724596865475e-05, -5.702348516933853e-06, 8.569886631448753e-07,
     -1.3153828604117734e-07, 2.415592881277462e-08, -4.524816521467301e-09, 4.650284601837029e-10),
)
# psi(a) = log a - 1/(2a) - W(1/a^2) / a^2 for a >= 8, degree 3: 3e-8 relative (of W: under 2^-40 of psi).
DG_FAR = (0.0833333358168602, -0.008333326317369938, 0.003966012038290501, -0.003937713336199522)
# In u = r^2 for |r| <= 1/2: log(sin(pi r) / (pi r)) / u, degree 6: 5.3e-9 relative; pi r cot(pi r) / (1 - 4u),
# degree 8: 1.1e-10 relative.
LOG_SINC = (-1.644934058189392, -0.5411619544029236, -0.3391306400299072, -0.25026556849479675, -0.2107120305299759,
            -0.10161522030830383, -0.3189915418624878)
COT = (1.0, 0.710131824016571, 0.6758861541748047, 0.6686236262321472, 0.6714824438095093, 0.6198174953460693,
       0.961152195930481, -0.3612503409385681, 2.3979103565216064)


def _log_pair(o, a):
    """log(a) = hi + lo to about 2^-29 relative for finite a > 0: fp32pow's log2 pair times ln 2."""
    f = o.f32
    lh, ll = _log2_pair(o, a)
    ph, pl = _two_prod(o, lh, f(LN2))
    return _fast_two_sum(o, ph, o.add(pl, o.add(o.mul(lh, f(LN2_LO)), o.mul(ll, f(LN2)))))


def _pair_poly(o, coeffs, t):
    """(c0 head, c0 tail + t (c1 + t (c2 + ...))) for per-element coefficient values."""
    return coeffs[0][0], o.add(coeffs[0][1], o.mul(t, horner_values(o, coeffs[1:], t)))


def _factor(o, a, zeros):
    """prod (a - zero) as an unevaluated pair for at most two zeros, one fp32 pair (head, tail) or two exact ones:
    the first difference is exact, so is the product of two."""
    f = o.f32
    if not zeros:
        return f(1), f(0)
    if len(zeros) == 1:
        return o.sub(o.sub(a, f(zeros[0][0])), f(zeros[0][1])), f(0)
    return _two_prod(o, o.sub(a, f(zeros[0][0])), o.sub(a, f(zeros[1][0])))


def _pieces(o, a, lows, centers, zeros, tables):
    """m P(a - center) on the piece of a (the last whose low end a reaches; NaN-free a on the pieces' span), m the
    piece's _factor: m times P's constant head is exact, so the sum rounds once more than P."""
    f = o.f32
    masks = [o.ge(a, f(low)) for low in lows[1:]]

    def pick(values):
        v = values[0]
        for m, val in zip(masks, values[1:]):
            v = o.select(m, val, v)
        return v
    t = o.sub(a, pick([f(c) for c in centers]))
    factors = [_factor(o, a, z) for z in zeros]
    mh, ml = pick([m[0] for m in factors]), pick([m[1] for m in factors])
    coeffs = [(pick([f(tab[0][0]) for tab in tables]), pick([f(tab[0][1]) for tab in tables]))]
    coeffs += [pick([f(tab[j]) for tab in tables]) for j in range(1, len(tables[0]))]
    head, tail = _pair_poly(o, coeffs, t)
    ph, pl = _two_prod(o, mh, head)
    return o.add(ph, o.add(pl, o.add(o.mul(mh, tail), o.mul(ml, head))))


def _stirling(o, a, lh, ll):
    """lgamma(a) for a >= 8, log a = lh + ll: a (log a - 1) + (log(2 pi) - log a) / 2 + W / a, where a (lh - 1) (lh - 1
    is exact) is an exact product below 2^64 and the rest a correction."""
    f = o.f32
    th = o.sub(lh, f(1))
    r = o.div(f(1), a)
    corr = o.add(o.sub(f(HALF_LOG_2PI), o.mul(f(0.5), o.add(lh, ll))), o.mul(r, horner(o, LG_FAR, o.mul(r, r))))
    _, err = _two_prod(o, float_min(o, a, SPLIT_MAX), th)
    err = o.select(o.lt(a, f(SPLIT_MAX)), err, f(0))
    return o.add(o.mul(a, th), o.add(o.add(err, o.mul(a, ll)), corr))


def lgamma(o, x):
    """log |Gamma(x)|: max error 1.9 ulp for x > 0, 3.2 ulps of the reflection's larger term below 0; +Inf at +-0, the
    negative integers (all of x <= -2^23), +-Inf and from x = 4.085e36 on (eager's float lgamma from 4.037e36)."""
    f = o.f32
    xn = no_nan(o, x)
    a = fabs(o, xn)
    af = o.select(o.and_(o.gt(a, f(0)), o.lt(a, f(INF))), a, f(1))
    lh, ll = _log_pair(o, af)
    xs = o.select(o.lt(a, f(SMALL)), xn, f(0))
    neg = o.lt(xs, f(0))
    q = horner_values(o, [o.select(neg, f(n), f(p)) for p, n in zip(LG_SMALL_POS, LG_SMALL_NEG)], xs)
    near = o.sub(o.sub(o.mul(xs, q), ll), lh)
    mid = _pieces(o, float_min(o, float_max(o, af, SMALL), FAR), LG_LOWS, LG_CENTERS, LG_ZEROS, LG_PIECES)
    far = _stirling(o, af, lh, ll)
    core = o.select(o.lt(a, f(SMALL)), near, o.select(o.lt(a, f(FAR)), mid, far))
    # below -1/2 the reflection, its logs as pairs: near a zero of lgamma the first sum is exact
    frac = fabs(o, o.sub(af, o.rint(af)))
    rh, rl = _log_pair(o, o.select(o.gt(frac, f(0)), frac, f(1)))
    sh, sl = _two_sum(o, lh, rh)
    u = o.mul(frac, frac)
    rest = o.add(o.add(sl, o.add(ll, rl)), o.mul(u, horner(o, LOG_SINC, u)))
    reflected = o.neg(o.add(o.add(core, sh), rest))
    negative = o.lt(xn, f(0))
    v = o.select(o.and_(negative, o.ge(a, f(SMALL))), reflected, core)
    pole = o.or_(o.and_(negative, o.eq(frac, f(0))), o.or_(o.eq(a, f(0)), o.eq(a, f(INF))))
    return o.select(o.isnan(x), x, o.select(pole, f(INF), v))


def digamma(o, x):
    """psi(x) = d/dx log Gamma(x): max error 1.7 ulp for x > 0, 4.4 ulps of the reflection's larger term below 0; -Inf
    at +0 and +Inf at -0 (as torch), NaN at the negative integers (all of x <= -2^23) and -Inf, +Inf at +Inf."""
    f = o.f32
    xn = no_nan(o, x)
    a = fabs(o, xn)
    af = o.select(o.and_(o.gt(a, f(0)), o.lt(a, f(INF))), a, f(1))
    inv = o.div(f(1), af)
    small = _pieces(o, float_min(o, af, 1.0), (0.0,), (0.5,), (((X0[0] - 1, X0[1]),),), (DG_SMALL,))   # psi(1 + a)
    mid = _pieces(o, float_min(o, float_max(o, af, SMALL), FAR), DG_LOWS, DG_CENTERS, DG_ZEROS, DG_PIECES)
    ab = float_max(o, af, FAR)
    lh, ll = _log_pair(o, ab)
    r = o.div(f(1), ab)
    far = o.add(lh, o.sub(ll, o.add(o.mul(f(0.5), r), o.mul(o.mul(r, r), horner(o, DG_FAR, o.mul(r, r))))))
    core = o.select(o.lt(a, f(FAR)), mid, far)                                  # psi(a) for a >= 1/2
    positive = o.select(o.lt(a, f(SMALL)), o.sub(small, inv), core)
    # pi cot(pi r) = 2 (1/2 - r)(1 + 2r) P(r^2) / r, with the sign of a - rint(a)
    frac = o.sub(af, o.rint(af))
    fa = fabs(o, frac)
    cot = o.mul(o.mul(o.sub(f(0.5), fa), o.add(f(1), o.add(fa, fa))), horner(o, COT, o.mul(fa, fa)))
    cot = o.div(o.add(cot, cot), fa)
    negative = o.add(o.select(o.lt(a, f(1)), small, o.add(core, inv)), copysign(o, cot, frac))
    is_neg = o.lt(xn, f(0))
    v = o.select(is_neg, negative, positive)
    v = o.select(o.and_(is_neg, o.eq(frac, f(0))), f(NAN), v)
    v = o.select(o.eq(a, f(INF)), o.select(is_neg, f(NAN), f(INF)), v)
    v = o.select(o.eq(a, f(0)), o.neg(copysign(o, f(INF), x)), v)
    return o.select(o.isnan(x), x, v)
