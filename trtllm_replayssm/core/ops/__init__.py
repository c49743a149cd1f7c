"""Custom ops (``torch.ops.replayssm.*``); importing a family module registers its ops."""
from trtllm_replayssm.core.ops import gdn, kda, mamba2  # noqa: F401  (register the mamba2_* / gdn_* / kda_* ops)
