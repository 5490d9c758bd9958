"""Training: where data and model meet. The workdir, captioning and scoring a split,
the callbacks, and the training loop `train_and_evaluate`."""
