"""Inference: a trained captioner from a preset or a workdir, read in one go, and the one
function that decodes with it (`inference`), the Python API (`api`), the preset format
with its weights file and its download (`preset`, `download`), the ImageNet tags, their
table and their decoding rule (`tags`), the off-world score (`off_world`), the SavedModel
export (`exporting`), the TFLite file (`tflite`) and captioning with it without
TensorFlow (`litert`, `litert_cache`), and the web page (`demo`). It reads the model, the
data and the preset format and never imports training."""
