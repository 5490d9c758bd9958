"""The model, as the paper writes it: the encoder, attention scores, the decoder step and
its teacher-forced loop, the captioner with its losses (REINFORCE included), and decoding
over any step function. Speed lives in `fast/`, a second schedule of the same step; what
the project adds beyond the paper and can keep apart lives beside this package
(`sat_tf.self_critical`, `sat_tf.decoding_rules`, `sat_tf.location_prior`)."""
