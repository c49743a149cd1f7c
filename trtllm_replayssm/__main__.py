"""``python -m trtllm_replayssm`` = the ``trtllm-replayssm`` command."""
from trtllm_replayssm.cli import main

main()
