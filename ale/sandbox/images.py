"""Environment images (ROCK's EnvHub, PAPER.md "ROCK"): build, cache by content, list, remove.

`build_image` builds a Dockerfile (normally `FROM ale/base:latest`) and tags it with a
hash of everything that determines the result: the build context's files (paths,
modes, bytes), the Dockerfile's name and the id of its base image. When that tag already
exists the build is skipped, so rebuilding an unchanged task costs one hash.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import docker

from ale.sandbox.spec import BASE_IMAGE

HASH_LABEL = "ale.image.hash"
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)", re.IGNORECASE | re.MULTILINE)


def _docker(client: docker.DockerClient | None) -> docker.DockerClient:
  return client if client is not None else docker.from_env(timeout=600)


def context_hash(
  context_dir: str | os.PathLike, dockerfile: str = "Dockerfile", *, base_id: str = ""
) -> str:
  """sha256 over the context's relative paths, modes and bytes, the Dockerfile name, base id."""
  root = os.fspath(context_dir)
  h = hashlib.sha256()
  h.update(f"dockerfile={dockerfile}\nbase={base_id}\n".encode())
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames.sort()
    for fn in sorted(filenames):
      full = os.path.join(dirpath, fn)
      rel = os.path.relpath(full, root)
      st = os.lstat(full)
      h.update(f"{rel}\0{st.st_mode & 0o777}\0".encode())
      if os.path.islink(full):
        h.update(os.readlink(full).encode())
      else:
        with open(full, "rb") as f:
          for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
      h.update(b"\0")
  return h.hexdigest()


def _base_id(client: docker.DockerClient, dockerfile_path: str) -> str:
  with open(dockerfile_path, encoding="utf-8") as f:
    m = _FROM.search(f.read())
  if not m:
    raise ValueError(f"{dockerfile_path} has no FROM line; start it with `FROM {BASE_IMAGE}`")
  try:
    return client.images.get(m.group(1)).id
  except docker.errors.ImageNotFound:
    raise ValueError(
      f"{dockerfile_path} builds FROM {m.group(1)!r}, which this engine lacks (nothing is pulled); "
      f"use FROM {BASE_IMAGE} (scripts/docker_up.sh builds it)"
    ) from None


def build_image(
  context_dir: str | os.PathLike,
  dockerfile: str = "Dockerfile",
  *,
  client: docker.DockerClient | None = None,
  tag_prefix: str = "ale/env",
) -> str:
  """Builds context_dir/dockerfile and returns its tag `tag_prefix:<hash16>` (cached).

  Raises ValueError for a missing Dockerfile or base image, and RuntimeError carrying the
  build log's tail when the build fails.
  """
  root = os.fspath(context_dir)
  path = os.path.join(root, dockerfile)
  if not os.path.isfile(path):
    raise ValueError(f"no {dockerfile} in {root!r}; a task image needs one (FROM {BASE_IMAGE})")
  dc = _docker(client)
  try:
    digest = context_hash(root, dockerfile, base_id=_base_id(dc, path))
    tag = f"{tag_prefix}:{digest[:16]}"
    try:
      dc.images.get(tag)
      return tag
    except docker.errors.ImageNotFound:
      pass
    try:
      dc.images.build(
        path=root,
        dockerfile=dockerfile,
        tag=tag,
        rm=True,
        forcerm=True,
        pull=False,
        labels={HASH_LABEL: digest},
      )
    except docker.errors.BuildError as e:
      tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(e.build_log)[-20:])
      raise RuntimeError(f"building {path} failed: {e.msg}\n{tail}") from None
    return tag
  finally:
    if client is None:
      dc.close()


def list_images(
  prefix: str = "ale/", *, client: docker.DockerClient | None = None
) -> list[dict[str, Any]]:
  """Images whose tags start with prefix: [{tag, id, size, created, hash}]."""
  dc = _docker(client)
  try:
    out = []
    for img in dc.images.list():
      for t in img.tags:
        if t.startswith(prefix):
          out.append(
            {
              "tag": t,
              "id": img.id,
              "size": img.attrs.get("Size"),
              "created": img.attrs.get("Created"),
              "hash": (img.labels or {}).get(HASH_LABEL),
            }
          )
    return sorted(out, key=lambda d: d["tag"])
  finally:
    if client is None:
      dc.close()


def remove_image(
  tag: str, *, client: docker.DockerClient | None = None, force: bool = False
) -> None:
  """Removes an image tag (ValueError when it does not exist)."""
  dc = _docker(client)
  try:
    dc.images.remove(tag, force=force)
  except docker.errors.ImageNotFound:
    raise ValueError(f"no image {tag!r} to remove") from None
  finally:
    if client is None:
      dc.close()
