"""ale.sandbox: ROCK, the sandbox execution engine (PAPER.md "ROCK").

    from ale.sandbox import Client, BASE_IMAGE
    async with Client() as client:                  # embedded service on the local engine
      async with await client.create(BASE_IMAGE) as sb:
        print((await sb.exec("python3 -V")).stdout)

Modules: `service` (control plane + aiohttp REST app), `backend` (Docker engine),
`engine` (async Engine API), `admission`, `egress` (the Rocklet), `audit`, `images`,
`client`, `cli` (`ale-sandbox serve`).
"""

from ale.sandbox.client import Client, RemoteEnv, Sandbox, SyncClient, SyncSandbox
from ale.sandbox.images import build_image, context_hash, list_images, remove_image
from ale.sandbox.service import SandboxService, make_app
from ale.sandbox.spec import (
  BASE_IMAGE,
  BadRequest,
  Conflict,
  ExecResult,
  NotFound,
  OverCapacity,
  SandboxError,
  SandboxSpec,
)

__all__ = [
  "BASE_IMAGE",
  "BadRequest",
  "Client",
  "Conflict",
  "ExecResult",
  "NotFound",
  "OverCapacity",
  "RemoteEnv",
  "Sandbox",
  "SandboxError",
  "SandboxService",
  "SandboxSpec",
  "SyncClient",
  "SyncSandbox",
  "build_image",
  "context_hash",
  "list_images",
  "make_app",
  "remove_image",
]
