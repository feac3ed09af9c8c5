"""Above the core and the catalog: the models checked against published runs (validation), their
constants fitted (calibration), the error budget, and the simulator checked against PyTorch's
own pipeline runtime (:mod:`.torchcheck`)."""
