"""Apache Beam pipelines: captioning files with an export (`caption_pipeline`, its rows
`caption_rows`, any SavedModel in `RunInference`: `beam_handler`) and writing the feature
cache (`extract_pipeline`, from a dataset on any filesystem: `remote_data`), and how they
are launched (`launch`: the options, the local default, the options every worker gets,
the runners whose workers cannot read a local path, the counters). Every path goes
through Beam's `FileSystems`. A room above inference and training, below the console
commands; importing this package loads neither Beam nor TensorFlow."""
