"""Training: where data and model meet. The workdir, the data of a run, feature
extraction into the cache (its shard step is also the Beam pipeline's), the optimizers,
captioning and scoring a split, the callbacks, the training loop `train_and_evaluate`,
and publishing a trained model as a preset."""
