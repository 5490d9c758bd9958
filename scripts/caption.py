"""Captions image files with a trained model and shows where it looked for every word.

  python scripts/caption.py photo.jpg other.png --workdir=runs/shapes --visualize=out/
  python scripts/caption.py photo.jpg --preset=<name, folder or https:// URL> --visualize=out/

Prints each caption with a per-word attention summary (argmax cell and weight); with
--visualize writes one PNG per image with a panel per word (paper Fig. 3); for a
hard-attention model each panel also outlines the cell it attended to.
"""

import os

import numpy as np
from absl import flags
from flags_lib import define_model_source, define_override, load_model, override, run

from sat_tf.data import image_io
from sat_tf.evaluation import visualize
from sat_tf.model.show_attend_tell import feature_encoder
from sat_tf.training import scoring

define_model_source()
define_override("beam_size", "Beam size (1 = greedy)")
flags.DEFINE_string("visualize", "", "Folder for one attention picture per image.")
FLAGS = flags.FLAGS


def main(argv):
    paths = argv[1:]
    if not paths:
        raise ValueError("give one or more image files to caption")
    beam_size = override(FLAGS, "beam_size")
    model, vocab, config = load_model(FLAGS)
    crop = config.effective_crop_fraction
    images = [image_io.load_image_file(p, config.image_size, crop) for p in paths]
    # A model trained on cached features runs the backbone that made them, as the export does.
    encoder = feature_encoder(model, config) if model.encoder is None else None
    caption = scoring.make_caption_fn(model, config, beam_size, encoder)
    out = caption({"image": np.stack([i.numpy() for i in images])})
    if FLAGS.visualize:
        os.makedirs(FLAGS.visualize, exist_ok=True)
    for i, path in enumerate(paths):
        n = int(out.length[i])
        words = vocab.decode(out.tokens[i][:n].numpy())
        alphas = out.attention[i, : n + 1].numpy()
        shown, points = visualize.caption_panels(words, alphas, config.attention == "hard")
        print(f"{path}: {' '.join(words)}")
        print(visualize.attention_summary(shown, alphas, model.grid))
        if FLAGS.visualize:
            pixels = np.clip(images[i].numpy(), 0, 255).astype(np.uint8)
            stem = os.path.splitext(os.path.basename(path))[0]
            target = os.path.join(FLAGS.visualize, f"{stem}_attention.png")
            visualize.attention_figure(
                pixels, shown, alphas, model.grid, hard_points=points, path=target
            )
            print(f"attention picture: {target}")


if __name__ == "__main__":
    run(main)
