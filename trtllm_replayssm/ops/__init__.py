"""Custom ops (``torch.ops.replayssm.*``); importing a family module registers its ops."""
from trtllm_replayssm.ops import mamba2  # noqa: F401  (registers torch.ops.replayssm.mamba2_*)
from trtllm_replayssm.ops import gdn, kda  # noqa: F401,E402  (register torch.ops.replayssm.gdn_* / kda_*)
from trtllm_replayssm.ops import layers  # noqa: F401,E402  (registers the fused decoder-layer ops)
