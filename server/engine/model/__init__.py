"""The model side of a step: packing canvases, the backbone's forward, the sampler, CUDA graphs and
the codec that turns tokens into audio."""
