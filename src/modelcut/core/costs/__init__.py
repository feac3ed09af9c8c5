"""What a step costs, piece by piece: FLOPs and parameters, matrix products and memory-bound
kernels, collectives and which links they ride (the device mesh), context parallelism and
experts."""
