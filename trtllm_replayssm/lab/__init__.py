"""Lab: kernel benchmarks beside the peers, reference hybrid decoders and their fused layers, ``compare``. Imports
core and serving; nothing in the product imports lab."""
