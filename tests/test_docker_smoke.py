"""Foundation smoke tests: the base image runs, isolated and limited, on a real engine."""

import pytest

pytestmark = pytest.mark.docker


def _run(client, image, command, **kwargs):
  container = client.containers.run(image, command, detach=True, network_mode="none", **kwargs)
  try:
    result = container.wait(timeout=120)
    logs = container.logs(stdout=True, stderr=True).decode()
    container.reload()
    return result["StatusCode"], logs, container.attrs["State"]
  finally:
    container.remove(force=True)


def test_python3_runs_in_base_image_without_network(docker_client, base_image):
  code, logs, _ = _run(
    docker_client, base_image, ["python3", "-c", "import sys; print(sys.version_info[:2])"]
  )
  assert code == 0, logs
  assert logs.strip().startswith("(3,"), logs


def test_memory_limit_kills_a_large_allocation(docker_client, base_image):
  code, logs, state = _run(
    docker_client,
    base_image,
    [
      "python3",
      "-c",
      "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096]); print('survived')",
    ],
    mem_limit="256m",
    memswap_limit="256m",
  )
  assert "survived" not in logs
  assert code == 137 or state.get("OOMKilled"), (code, state, logs)


def test_container_sees_only_loopback(docker_client, base_image):
  code, logs, _ = _run(docker_client, base_image, ["ls", "/sys/class/net"])
  assert code == 0, logs
  assert logs.split() == ["lo"]


def test_base_image_has_the_recipe_tools(docker_client, base_image):
  tools = ["bash", "python3", "git", "tmux", "ps", "sqlite3", "jq", "pytest"]
  code, logs, _ = _run(
    docker_client,
    base_image,
    ["bash", "-c", f"for t in {' '.join(tools)}; do command -v $t || echo MISSING $t; done"],
  )
  assert code == 0 and "MISSING" not in logs, logs
