"""Inference: a trained captioner from a preset or a workdir and the one function that
decodes with it (`inference`), the Python API (`api`), the preset format and its download
(`preset`, `npz_weights`, `download`), the decoding rule of ImageNet tags (`tags`), the
off-world score (`off_world`), the SavedModel and TFLite export (`exporting`) and the web
page on it (`demo`). It reads the model, the data and the preset format and never imports
training."""
