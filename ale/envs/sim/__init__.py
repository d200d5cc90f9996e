"""In-process simulated tool environments (files, billing, e-commerce); no Docker."""

from ale.envs.sim.base import DIFFICULTIES, Scenario, SimEnv, SimWorld, difficulty_index
from ale.envs.sim.billing import BillingWorld, SimBillingEnv
from ale.envs.sim.files import FileSystemWorld, SimFilesEnv
from ale.envs.sim.shop import ShopWorld, SimShopEnv

FAMILIES = {"files": SimFilesEnv, "billing": SimBillingEnv, "shop": SimShopEnv}

__all__ = [
  "DIFFICULTIES",
  "FAMILIES",
  "BillingWorld",
  "FileSystemWorld",
  "Scenario",
  "ShopWorld",
  "SimBillingEnv",
  "SimEnv",
  "SimFilesEnv",
  "SimShopEnv",
  "SimWorld",
  "difficulty_index",
]
