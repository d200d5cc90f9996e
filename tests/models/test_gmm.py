"""The CPU grouped-matmul kernel (ale.models.gmm) against NumPy, its gradients against
`jax.lax.ragged_dot`'s, under shard_map, and its errors."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ale.models import gmm, make_mesh

if not gmm.available():
  if os.environ.get("CI") or os.environ.get("ALE_REQUIRE_KERNEL"):
    pytest.fail("the grouped-matmul kernel must build in CI (g++ and scipy-openblas32)")
  pytest.skip(
    "the grouped-matmul kernel cannot be built here (see the log)", allow_module_level=True
  )


def _groups(rng, m, g, total=None, empty=(1,)):
  """Random group sizes over `total` (default m) rows with the `empty` groups at 0."""
  p = np.ones(g)
  p[list(empty)] = 0
  p[0] = 5  # one big group (more than one row chunk)
  return rng.multinomial(m if total is None else total, p / p.sum()).astype(np.int32)


def _np_gmm(x, w, gs, transpose_rhs=False):
  out = np.zeros((x.shape[0], w.shape[1] if transpose_rhs else w.shape[2]), np.float64)
  r = 0
  for g, n in enumerate(gs):
    wg = w[g].T if transpose_rhs else w[g]
    out[r : r + n] = x[r : r + n].astype(np.float64) @ wg
    r += n
  return out


def _np_tgmm(x, dy, gs):
  out = np.zeros((len(gs), x.shape[1], dy.shape[1]), np.float64)
  r = 0
  for g, n in enumerate(gs):
    out[g] = x[r : r + n].T.astype(np.float64) @ dy[r : r + n]
    r += n
  return out


@pytest.mark.parametrize("transpose_rhs", [False, True])
@pytest.mark.parametrize("m,k,n,g,total", [(300, 24, 40, 6, None), (517, 64, 32, 8, 450)])
def test_gmm_and_tgmm_equal_numpy(m, k, n, g, total, transpose_rhs):
  """Uneven, empty and oversized (several row chunks) groups; rows past the groups -> 0."""
  rng = np.random.default_rng(m)
  x = rng.normal(size=(m, k)).astype(np.float32)
  w = rng.normal(size=(g, n, k) if transpose_rhs else (g, k, n)).astype(np.float32)
  dy = rng.normal(size=(m, n)).astype(np.float32)
  gs = _groups(rng, m, g, total)
  out = jax.jit(gmm.gmm, static_argnums=3)(x, w, gs, transpose_rhs)
  np.testing.assert_allclose(np.asarray(out), _np_gmm(x, w, gs, transpose_rhs), atol=1e-4)
  if total is not None:
    assert not np.asarray(out)[total:].any()
  dw = jax.jit(gmm.tgmm)(x, dy, gs)
  np.testing.assert_allclose(np.asarray(dw), _np_tgmm(x, dy, gs), atol=1e-3, rtol=1e-5)
  assert not np.asarray(dw)[1].any()  # the empty group


def test_gmm_gradients_equal_ragged_dot():
  rng = np.random.default_rng(0)
  m, k, n, g = 200, 16, 24, 5
  x = jnp.asarray(rng.normal(size=(m, k)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(g, k, n)), jnp.float32)
  gs = jnp.asarray(_groups(rng, m, g, 180))

  def loss(f):
    return lambda x, w: jnp.sum(jnp.sin(f(x, w, gs)))

  ours = jax.jit(jax.value_and_grad(loss(gmm.gmm), argnums=(0, 1)))(x, w)
  ref = jax.value_and_grad(loss(jax.lax.ragged_dot), argnums=(0, 1))(x, w)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-5)
  # transposed weights: the same products, and d rhs comes back transposed
  wt = jnp.swapaxes(w, 1, 2)
  gt = jax.grad(lambda w: jnp.sum(jnp.sin(gmm.gmm(x, w, gs, transpose_rhs=True))))(wt)
  np.testing.assert_allclose(np.asarray(gt), np.asarray(jnp.swapaxes(ref[1][1], 1, 2)), atol=1e-4)


def test_gmm_casts_other_dtypes():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(40, 8)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(3, 8, 4)), jnp.bfloat16)
  gs = jnp.array([10, 0, 30], jnp.int32)
  out = gmm.gmm(x, w, gs)
  assert out.dtype == jnp.bfloat16
  ref = _np_gmm(np.asarray(x, np.float32), np.asarray(w, np.float32), np.asarray(gs))
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=0.1, rtol=0.02)


def test_gmm_under_shard_map_matches_unsharded():
  """Rows split over 4 devices (each shard its own groups), weights replicated: values
  and the weight gradient (psum'd over the shards) equal the single-device results."""
  mesh = make_mesh(data=4, fsdp=2)
  P = jax.sharding.PartitionSpec
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(4, 50, 8)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 8, 6)), jnp.float32)
  gs = jnp.asarray(np.stack([_groups(rng, 50, 3, 45, empty=()) for _ in range(4)]))

  def local(x, w, gs):
    return gmm.gmm(x[0], w, gs[0])[None]

  def loss(x, w, gs, f):
    return jnp.sum(jnp.cos(f(x, w, gs)))

  sharded = jax.shard_map(
    local, mesh=mesh, in_specs=(P("data"), P(), P("data")), out_specs=P("data")
  )

  def plain(x, w, gs):
    return jnp.stack([jax.lax.ragged_dot(x[i], w, gs[i]) for i in range(4)])

  with jax.set_mesh(mesh):
    v1, g1 = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=3)(x, w, gs, sharded)
  v0, g0 = jax.value_and_grad(loss, argnums=(0, 1))(x, w, gs, plain)
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
  for a, b in zip(g1, g0, strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-5)


def test_bad_inputs_are_named():
  x = jnp.ones((10, 4))
  with pytest.raises(ValueError, match="disagree"):
    gmm.gmm(x, jnp.ones((2, 5, 3)), jnp.array([5, 5], jnp.int32))
  with pytest.raises(ValueError, match="expects lhs"):
    gmm.gmm(x[0], jnp.ones((2, 4, 3)), jnp.array([5, 5], jnp.int32))
  with pytest.raises(ValueError, match="tgmm expects"):
    gmm.tgmm(x, jnp.ones((9, 3)), jnp.array([5, 5], jnp.int32))
  # Group sizes are data: checked by the kernel at run time, named in the error.
  with pytest.raises(Exception, match="exceeds the rows of lhs"):
    jax.block_until_ready(gmm.gmm(x, jnp.ones((2, 4, 3)), jnp.array([6, 5], jnp.int32)))
  with pytest.raises(Exception, match="non-negative"):
    jax.block_until_ready(gmm.gmm(x, jnp.ones((2, 4, 3)), jnp.array([-1, 5], jnp.int32)))


def test_build_without_a_compiler_says_why(tmp_path, monkeypatch):
  monkeypatch.setenv("ALE_KERNEL_CACHE", str(tmp_path))
  monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
  with pytest.raises(gmm.KernelUnavailable, match="no-such-compiler"):
    gmm.build()


def test_build_is_cached(tmp_path, monkeypatch):
  monkeypatch.setenv("ALE_KERNEL_CACHE", str(tmp_path))
  first = gmm.build()
  mtime = first.stat().st_mtime_ns
  assert gmm.build() == first and first.stat().st_mtime_ns == mtime
  assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporaries left
