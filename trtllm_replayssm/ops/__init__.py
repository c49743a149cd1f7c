"""Custom ops (``torch.ops.replayssm.*``); importing a family module registers its ops."""
from trtllm_replayssm.ops import mamba2  # noqa: F401  (registers torch.ops.replayssm.mamba2_*)
