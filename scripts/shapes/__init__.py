"""Shapes of synthetic files per family: scripts/shapes/<arch with _ for ->.py defines `shapes(sm)`,
shape name -> (synth_models spec keywords, the file's metadata); scripts/synth_shapes.py writes them."""
