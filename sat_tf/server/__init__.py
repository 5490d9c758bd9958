"""The model server: sat-serve (TF Serving's REST and gRPC APIs over version folders of
exports) and the demo page, built on the captioner's exports (`sat_tf.serving`)."""
