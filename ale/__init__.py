"""ale: the Agentic Learning Ecosystem (ROME paper) in JAX.

Subpackages: ipa, chat, models, inference, sandbox, envs, agents, rollout, train, data.
Import them directly (``from ale import ipa``); this top level imports nothing heavy.
"""

__version__ = "0.1.0"
