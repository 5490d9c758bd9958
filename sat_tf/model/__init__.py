"""The model, as the paper writes it: the encoder, attention scores, the decoder step and
its teacher-forced loop, the captioner with its losses (REINFORCE included), and decoding
over any step function. Speed lives in `fast/`, a second schedule of the same step. What
the project adds beyond the paper and can keep apart sits in modules of its own, imported
by the model and importing none of the paper's: `self_critical` (self-critical sequence
training), `decoding_rules`, `location_prior`, and `resumable` (the Keras base class that
makes training resume exactly)."""
