"""The protobuf messages sat-serve reads that the tensorflow-serving-api wheel leaves out:
`.proto` files with TF Serving's names and field numbers in package `sat_tf.server`, and
the `<name>_pb2.py` modules grpcio-tools generates from them (tests/protos_test.py
regenerates each and compares)."""
