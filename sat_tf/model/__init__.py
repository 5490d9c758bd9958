"""The model: encoders, attention scores, the decoder step and its schedules, the
captioner with its losses and REINFORCE terms, and decoding over any step function."""
