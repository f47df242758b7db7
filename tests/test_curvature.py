"""Per-layer Hessian eigenvalues against torch.linalg.eigvalsh on a model small enough to form them."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from triaccel.curvature import HessianProbe


def _setup():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 5))
    x, y = torch.randn(32, 12), torch.randint(0, 5, (32,))
    return m, x, y


def _exact_blocks(m, x, y):
    out = []
    for li, layer in enumerate((m[0], m[2])):
        ps = list(layer.parameters())
        flat = torch.cat([p.reshape(-1) for p in ps]).detach()

        def f(v, li=li, ps=ps):
            w = v[:ps[0].numel()].view_as(ps[0])
            b = v[ps[0].numel():].view_as(ps[1])
            if li == 0:
                return F.cross_entropy(m[2](torch.tanh(F.linear(x, w, b))), y)
            return F.cross_entropy(F.linear(torch.tanh(m[0](x)), w, b), y)

        ev = torch.linalg.eigvalsh(torch.autograd.functional.hessian(f, flat))
        out.append(ev[ev.abs().argsort(descending=True)])
    return out


@pytest.mark.parametrize("vmap", [False, True])
def test_topk_agrees_with_eigvalsh(vmap):
    m, x, y = _setup()
    probe = HessianProbe(m, [list(m[0].parameters()), list(m[2].parameters())], top_k=5, max_iters=300, tol=1e-8,
                         mode="exact", vmap=vmap)
    est = probe.estimate(lambda: F.cross_entropy(m(x), y))
    for li, ref in enumerate(_exact_blocks(m, x, y)):
        assert torch.allclose(torch.tensor(est[li]), ref[:5], rtol=1e-3, atol=1e-5), (est[li], ref[:5])


def _conv_bn():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 3), nn.Flatten(),
                      nn.Linear(4 * 4 * 4, 5)).train()
    x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 5, (8,))
    return m, [list(m[0].parameters()), list(m[3].parameters()), list(m[5].parameters())], x, y


def test_checkpointed_bases_resume_the_iteration():
    m, layers, x, y = _conv_bn()
    lf = lambda: F.cross_entropy(m(x), y)
    a = HessianProbe(m, layers, top_k=2, max_iters=3, mode="exact")
    a.estimate(lf)
    b = HessianProbe(m, layers, top_k=2, max_iters=3, mode="exact")
    b.load_state_dict(a.state_dict())
    assert a.estimate(lf) == b.estimate(lf)


def test_unknown_mode_is_refused():
    m, layers, _, _ = _conv_bn()
    with pytest.raises(ValueError, match="mode"):
        HessianProbe(m, layers, mode="diagonal")


def test_warm_start_converges_in_fewer_iterations():
    m, x, y = _setup()
    probe = HessianProbe(m, [list(m[0].parameters()), list(m[2].parameters())], top_k=1, max_iters=200, tol=1e-4,
                         mode="exact")
    lf = lambda: F.cross_entropy(m(x), y)
    probe.estimate(lf)
    cold = probe.last_iters
    probe.estimate(lf)
    assert probe.last_iters < cold
    ref = _exact_blocks(m, x, y)
    # lambda_max (largest magnitude) within the tolerance
    assert abs(probe.estimate(lf)[1][0] - float(ref[1][0])) < 1e-2 * abs(float(ref[1][0]))


def test_batched_products_are_unbiased_block_products():
    """One sign-mixed product serves every layer: s_l (H v)_l = H_ll v_l + sum_m s_l s_m H_lm v_m.
    Over all 2^L sign patterns the cross terms cancel exactly, so the mean is the exact block
    product (what the controller's EMA over refreshes relies on); a single draw is noisy."""
    m, layers, x, y = _conv_bn()
    lf = lambda: F.cross_entropy(m(x), y)
    exact = HessianProbe(m, layers, top_k=2, mode="exact", max_iters=2)
    exact.estimate(lf)
    batched = HessianProbe(m, layers, top_k=2, mode="batched")
    batched.V = exact.V.clone()
    w_exact = exact._autograd_products(lf, False)()
    prod = batched._autograd_products(lf, False)
    L = len(layers)
    patterns = [torch.tensor([[1.0 if (p >> li) & 1 else -1.0] * 2 for li in range(L)]) for p in range(2 ** L)]
    each = [prod(s) for s in patterns]
    mean = sum(each) / len(each)
    tol = 1e-4
    for li in range(L):
        r = slice(exact.rows[li], exact.rows[li + 1])
        ref = torch.linalg.norm(w_exact[r])
        assert torch.linalg.norm(mean[r] - w_exact[r]) < tol * ref
        assert max(torch.linalg.norm(w[r] - w_exact[r]) for w in each) > 0.1 * ref  # cross terms are real


def test_probe_leaves_batchnorm_statistics_untouched():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).train()
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    HessianProbe(m, [list(m[0].parameters()), list(m[3].parameters())], top_k=2, max_iters=3).estimate(
        lambda: F.cross_entropy(m(x), y))
    after = m.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_vmapped_hvps_only_on_cuda_and_not_for_nhwc_weights():
    from triaccel.curvature import vmap_by_default

    conv = nn.Conv2d(3, 4, 3)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert vmap_by_default(cuda, list(conv.parameters()))
    assert not vmap_by_default(cpu, list(conv.parameters()))
    conv = conv.to(memory_format=torch.channels_last)  # cuDNN's backward queries this format inside vmap
    assert not vmap_by_default(cuda, list(conv.parameters()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mode", ["exact", "batched"])
def test_cuda_graph_replays_match_the_eager_probe(mode):
    """Captured once, replayed per iteration: same bases, same signs, same eigenvalues as eager;
    new values in the static inputs are seen by the replay; the model is left as it was."""
    m, layers, x, y = _conv_bn()
    m = m.cuda()
    layers = [list(m[0].parameters()), list(m[3].parameters()), list(m[5].parameters())]
    x, y = x.cuda(), y.cuda()
    lf = lambda: F.cross_entropy(m(x), y)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    eager = HessianProbe(m, layers, top_k=2, max_iters=4, tol=1e-30, mode=mode, graphs=False, seed=5)
    graph = HessianProbe(m, layers, top_k=2, max_iters=4, tol=1e-30, mode=mode, graphs=True, seed=5)
    for _ in range(2):
        a, b = eager.estimate(lf, static_inputs=True), graph.estimate(lf, static_inputs=True)
        assert graph._graph is not None
        assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-3, atol=1e-6), (a, b)
        x.copy_(torch.randn_like(x))  # a new probe batch in the same tensor
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


@pytest.mark.parametrize("mode", ["exact", "batched"])
def test_a_layer_the_loss_never_reaches_has_zero_curvature_and_the_others_are_exact(mode):
    """A user's model with a layer its forward does not use (or uses only on some calls): the probe's
    first backward raised 'appears to not have been used in the graph'. The unused layer's eigenvalues
    are 0; the used layers' are as without it."""
    m, x, y = _setup()
    unused = nn.Linear(8, 8)
    probe = HessianProbe(m, [list(m[0].parameters()), list(unused.parameters()), list(m[2].parameters())], top_k=3,
                         max_iters=300, tol=1e-8, mode=mode)
    est = probe.estimate(lambda: F.cross_entropy(m(x), y))
    assert all(v == 0.0 for v in est[1]), est[1]
    if mode == "exact":
        ref = _exact_blocks(m, x, y)
        for li, r in ((0, ref[0]), (2, ref[1])):
            assert torch.allclose(torch.tensor(est[li]), r[:3], rtol=1e-3, atol=1e-5), (est[li], r[:3])
    else:
        assert any(v != 0.0 for v in est[0] + est[2])
