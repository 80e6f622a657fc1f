"""Kernels in the pypto dialect: the article's skeleton (``skeleton``) and the source material's
production RoPE kernels (``kernels``). ``python -m tilerope.pypto.examples.skeleton`` runs the
skeleton on the CPU and prints its error against an fp64 golden."""
