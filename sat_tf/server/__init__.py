"""The model server: TF Serving's REST and gRPC APIs over exported SavedModels."""
