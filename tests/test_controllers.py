"""The three controllers on fabricated statistics: thresholds, hysteresis, dwell, promotion, budget edges."""
import pytest

from triaccel.config import BatchConfig, CurvatureConfig, PrecisionConfig
from triaccel.controllers import BatchController, CurvatureController, PrecisionController

GiB = 2**30


def pc(**kw):
    base = dict(tau_low=1e-6, tau_high=1e-4, hysteresis=0.1, min_dwell=0)
    base.update(kw)
    return PrecisionConfig(**base)


def test_precision_thresholds_map_variance_to_levels():
    c = PrecisionController(pc(hysteresis=0.0), 3, initial="bf16")
    d = c.update([1e-7, 1e-5, 1e-3], window=1)
    assert d.levels == ("fp16", "bf16", "fp32")
    # boundaries: v == tau_low -> BF16, v == tau_high -> FP32 (the paper's <, <=)
    c = PrecisionController(pc(hysteresis=0.0), 2, initial="bf16")
    assert c.update([1e-6, 1e-4], window=1).levels == ("bf16", "fp32")


def test_precision_hysteresis_holds_a_layer_on_the_threshold():
    c = PrecisionController(pc(hysteresis=0.2), 1, initial="bf16")
    assert c.update([0.9e-4], 1).levels == ("bf16",)  # below tau_high
    assert c.update([1.1e-4], 2).levels == ("bf16",)  # above tau_high but inside the band
    assert c.update([1.3e-4], 3).levels == ("fp32",)  # clearly above
    assert c.update([0.9e-4], 4).levels == ("fp32",)  # back below tau_high, still inside the band
    assert c.update([0.7e-4], 5).levels == ("bf16",)


def test_precision_min_dwell():
    c = PrecisionController(pc(hysteresis=0.0, min_dwell=3), 1, initial="bf16")
    assert c.update([1e-3], 1).levels == ("fp32",)
    assert c.update([1e-8], 2).levels == ("fp32",)  # dwell: changed at window 1
    assert c.update([1e-8], 3).levels == ("fp32",)
    assert c.update([1e-8], 4).levels == ("fp16",)


def test_curvature_promotes_one_level_temporarily():
    c = PrecisionController(pc(hysteresis=0.0), 3, initial="bf16", tau_curv=10.0)
    d = c.update([1e-7, 1e-5, 1e-3], 1, curvature=[50.0, 50.0, 50.0])
    assert d.levels == ("bf16", "fp32", "fp32") and d.reasons[:2] == ("curvature", "curvature")
    d = c.update([1e-7, 1e-5, 1e-3], 2, curvature=[1.0, 1.0, 1.0])
    assert d.levels == ("fp16", "bf16", "fp32")


def test_overflow_promotes_fp16_layer_despite_dwell():
    c = PrecisionController(pc(hysteresis=0.0, min_dwell=100), 2, initial="fp16")
    d = c.update([1e-9, 1e-9], 1, overflow=[True, False])
    assert d.levels == ("bf16", "fp16") and d.reasons[0] == "overflow"


def test_precision_state_roundtrip():
    c = PrecisionController(pc(min_dwell=2), 2)
    c.update([1e-3, 1e-9], 1)
    c2 = PrecisionController(pc(min_dwell=2), 2)
    c2.load_state_dict(c.state_dict())
    assert c2.update([1e-9, 1e-3], 2) == c.update([1e-9, 1e-3], 2)


def test_curvature_lr_scale_clips_negative_and_smooths():
    c = CurvatureController(CurvatureConfig(alpha=0.1, tau_curv=5.0, ema=0.5), 2)
    d = c.update([[10.0, 3.0], [-4.0, -1.0]])
    assert d.lam == (10.0, 0.0)
    assert d.lr_scale[0] == pytest.approx(1 / (1 + 0.1 * 10)) and d.lr_scale[1] == 1.0
    assert d.promote == (True, False)
    d = c.update([[2.0], [0.0]])
    assert d.lam[0] == pytest.approx(6.0)  # 0.5 * 10 + 0.5 * 2
    assert c.due(1) and c.due(200) and not c.due(199)


def bc(**kw):
    base = dict(rho_low=0.5, rho_high=0.8, delta_up=16, delta_down=32, min_batch=8, max_batch=512, cooldown=0)
    base.update(kw)
    return BatchConfig(**base)


def test_batch_grows_below_rho_low_and_shrinks_above_rho_high():
    c = BatchController(bc(), 96, 96, 1 * GiB)
    assert c.update(0.3 * GiB).batch == 112
    assert c.update(0.6 * GiB).action == "hold"
    d = c.update(0.9 * GiB)
    # the fit through (96, 0.3) and (112, 0.9) puts 0.8 GiB at B=109: a smaller step than delta_down
    assert d.action == "shrink" and d.batch == 109
    c = BatchController(bc(), 96, 96, 1 * GiB)
    assert c.update(0.9 * GiB).batch == 64  # no fit yet: the plain delta_down step


def test_batch_respects_bounds_and_cooldown():
    c = BatchController(bc(min_batch=90, max_batch=100, cooldown=2), 96, 96, 1 * GiB)
    assert c.update(0.1 * GiB).batch == 100
    assert c.update(0.1 * GiB).action == "cooldown"
    assert c.update(0.1 * GiB).action == "cooldown"
    assert c.update(0.1 * GiB).batch == 100  # max
    c = BatchController(bc(min_batch=90), 96, 96, 1 * GiB)
    assert c.update(0.99 * GiB).batch == 90  # min


def test_batch_predicts_and_does_not_grow_into_the_wall():
    c = BatchController(bc(delta_up=64), 64, 64, 1 * GiB)
    # peak = 0.1 GiB + 0.005 GiB per example: 64 -> 0.42, 128 -> 0.74, 192 would be 1.06
    c.update(0.42 * GiB)  # grows to 128
    assert c.batch == 128
    d = c.update(0.74 * GiB * 0.6)  # pretend usage dipped below rho_low; the fit still knows 192 is too big
    assert d.action in ("predicted", "grow")
    c2 = BatchController(bc(delta_up=64), 64, 64, 1 * GiB)
    c2.obs = [(64, 0.42 * GiB), (128, 0.74 * GiB)]
    c2.micro = 128
    c2.batch = 128
    assert c2.update(0.45 * GiB).action == "predicted"


def test_oom_ceiling_is_never_regrown():
    c = BatchController(bc(delta_up=64), 128, 128, 1 * GiB)
    c.on_oom(128)
    assert c.micro == 64 and c.batch == 127
    for _ in range(5):
        d = c.update(0.1 * GiB)
    assert d.micro_batch < 128


def test_constant_mode_keeps_batch_and_moves_micro_batch():
    c = BatchController(bc(mode="constant"), 256, 64, 1 * GiB)
    d = c.update(0.1 * GiB)
    assert d.batch == 256 and d.micro_batch == 80
    d = c.update(0.95 * GiB)
    assert d.batch == 256 and d.micro_batch == 77  # the fit: 0.8 GiB at a micro-batch of 77
    assert c.lr_factor(256) == 1.0


def test_lr_rules():
    c = BatchController(bc(lr_rule="sqrt"), 100, 100, GiB)
    c.batch = 400
    assert c.lr_factor(100) == pytest.approx(2.0)
    c.cfg = bc(lr_rule="linear")
    assert c.lr_factor(100) == pytest.approx(4.0)


def test_shrink_stops_where_the_fit_says_the_batch_fits():
    """peak = 0.26 + 0.0037 B GiB, budget 0.494 GiB, rho_high 0.85: about 43 fits; delta_down 32 would give 32."""
    c = BatchController(bc(rho_low=0.5, rho_high=0.85, delta_down=32, min_batch=8), 96, 96, 0.494 * GiB)
    peak = lambda b: (0.26 + 0.0037 * b) * GiB  # noqa: E731
    d = c.update(peak(96))
    assert d.batch == 64  # one observation: no fit yet, the plain step
    d = c.update(peak(64))
    assert d.action == "shrink" and d.batch == 43
    assert peak(d.batch) <= 0.85 * 0.494 * GiB
