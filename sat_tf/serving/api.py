"""The Python API: caption photos with a trained model in three lines.

    from sat_tf import Captioner
    captioner = Captioner.from_preset("flickr8k_lite0_soft")
    print(captioner.caption("photo.jpg")[0].text)

`Captioner.caption` takes one image or a list of them, each a file path, encoded bytes
(JPEG / PNG / GIF / BMP / WebP), a PIL image or a numpy array; it brings every image to the
model's geometry with the package's own image code (`sat_tf.data.image_io`: shorter side
to `image_size / crop_fraction`, centre crop), captions them in batches with the model's
own decoding (`ShowAttendTell.generate`, greedy or beam search; made to name the
photo's confident ImageNet tag where the preset has a tag table, `sat_tf.serving.tags`) and
returns one `Caption` per image: the words, their ids, the caption's log-probability, the
tag, where the model looked for every word and, for a model with off-world statistics
(`sat_tf.serving.off_world`), how unlike its training photos the photo is.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sat_tf.data import image_io
from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation import visualize
from sat_tf.serving import captions as captions_lib
from sat_tf.serving import inference
from sat_tf.serving import off_world as off_world_lib
from sat_tf.serving.captions import Caption
from sat_tf.serving.inference import feature_encoder


class Captioner:
    """Captions images with a trained `ShowAttendTell`.

    Args:
      model: a `ShowAttendTell` (e.g. `sat_tf.load(...).model`).
      vocab: its `Vocab`.
      config: its `Config` (image size and crop, decoding length, default beam size).
      batch_size: images per call of the model.
      max_image_pixels: the most pixels (width x height) of a file or bytes that are
        decoded; larger ones are refused from their header (`image_io.admit`), before
        a pixel is allocated.
      off_world: its `off_world.Stats`, for `Caption.off_world_score`; None for none.
    """

    def __init__(
        self,
        model,
        vocab,
        config,
        batch_size: int = 16,
        max_image_pixels: int = image_io.MAX_IMAGE_PIXELS,
        off_world=None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        if max_image_pixels < 1:
            raise ValueError(f"max_image_pixels={max_image_pixels} must be at least 1")
        if off_world is not None and off_world.feature_dim != model.feature_dim:
            raise ValueError(
                f"off-world statistics of {off_world.feature_dim}-wide features; the model "
                f"reads {model.feature_dim}"
            )
        self.model, self.vocab, self.config = model, vocab, config
        self.off_world = off_world
        self.batch_size = batch_size
        self.max_image_pixels = max_image_pixels
        self.crop_fraction = config.effective_crop_fraction
        # A model trained on cached features runs the backbone that made them.
        self._encoder = feature_encoder(model, config) if model.encoder is None else None
        self._caption_fns = {}

    @classmethod
    def from_trained(cls, trained: inference.Trained, **kwargs) -> "Captioner":
        """A captioner of what `inference.load` read, with its off-world statistics."""
        return cls(
            trained.model, trained.vocab, trained.config, off_world=trained.off_world, **kwargs
        )

    @classmethod
    def from_preset(
        cls, source: str, cache_dir: str | None = None, runtime: str = "auto", **kwargs
    ) -> "Captioner":
        """A captioner of a preset: a shipped name (`preset.names()`), a preset
        folder, or an https:// URL of a preset archive (`#sha256=<hex>` checks it); with
        the preset's off-world statistics where it has them.

        `runtime`: "tensorflow"; "litert" (`sat_tf.serving.litert.LiteRTCaptioner`: the
        same captions without TensorFlow, its TFLite file built into the cache first if
        it is not there); "auto", LiteRT where that file is already in the cache
        (`sat-caption` builds it), else TensorFlow."""
        if runtime != "tensorflow":
            from sat_tf.serving import litert

            captioner = litert.from_source("preset", source, runtime, cache_dir, **kwargs)
            if captioner is not None:
                return captioner
        return cls.from_trained(inference.load(source, cache_dir, kind="preset"), **kwargs)

    @classmethod
    def from_workdir(cls, workdir: str, runtime: str = "auto", **kwargs) -> "Captioner":
        """A captioner of a training workdir (`sat-train`): its best weights, and its
        off-world statistics where `sat-off-world` wrote them; `runtime` as for
        `from_preset`."""
        if runtime != "tensorflow":
            from sat_tf.serving import litert

            captioner = litert.from_source("workdir", workdir, runtime, **kwargs)
            if captioner is not None:
                return captioner
        return cls.from_trained(inference.load(workdir, kind="workdir"), **kwargs)

    @property
    def image_size(self) -> int:
        return self.config.image_size

    @property
    def grid(self) -> tuple[int, int]:
        """(H, W) of the attention maps."""
        return tuple(self.model.grid)

    def load_image(self, image: Any, index: int = 0) -> np.ndarray:
        """One image at the model's geometry: (S, S, 3) float32 pixels in [0, 255].

        Args:
          image: a file path (str or `os.PathLike`), encoded bytes, a PIL image, or a
            numpy array (H, W, 3) of uint8 or of floats in [0, 255] (grayscale and RGBA
            are converted).
          index: its place in a batch, for error messages.

        Raises:
          ValueError: naming the image (its path, or its place in the batch) and what is
            wrong with it; `image_io.ImageError` for a file or bytes that are empty, not
            an image, truncated or corrupt, or over `max_image_pixels`.
        """
        return captions_lib.pixels(
            image, index, self.image_size, self.crop_fraction, self.max_image_pixels, image_io
        )

    def _features(self, pixels):
        """(N, L, D) annotation vectors of (N, S, S, 3) pixels."""
        if self._encoder is not None:
            return self._encoder(pixels, training=False)
        return self.model.encode({"image": pixels})

    def _caption_fn(self, beam_size):
        """A `tf.function` of pixels -> (`DecodeResult`, off-world score or None)."""
        if beam_size not in self._caption_fns:
            decode = inference.make_caption_fn(self.model, self.config, beam_size, vocab=self.vocab)
            stats = self.off_world

            @tf.function(reduce_retracing=True, autograph=False)
            def caption(pixels):
                features = self._features(pixels)
                scores = None if stats is None else off_world_lib.score(features, stats)[0]
                return decode({"features": features}), scores

            self._caption_fns[beam_size] = caption
        return self._caption_fns[beam_size]

    def caption_pixels(self, pixels: np.ndarray, beam_size: int | None = None) -> list[Caption]:
        """Captions images already at the model's geometry (`load_image`).

        Args:
          pixels: (N, S, S, 3) float pixels in [0, 255].
          beam_size: 1 for greedy decoding, k for beam search; None for the config's.

        Returns:
          one `Caption` per image.
        """
        if beam_size is not None and beam_size < 1:
            raise ValueError(f"beam_size={beam_size} must be at least 1 (None: the model's)")
        pixels = np.asarray(pixels, np.float32)
        size = self.image_size
        if pixels.ndim != 4 or pixels.shape[1:] != (size, size, 3):
            raise ValueError(f"pixels must be (N, {size}, {size}, 3); got {pixels.shape}")
        captions = []
        caption = self._caption_fn(beam_size)
        for start in range(0, len(pixels), self.batch_size):
            chunk = pixels[start : start + self.batch_size]
            out, scores = caption(tf.constant(chunk))
            tokens, lengths = out.tokens.numpy(), out.length.numpy()
            maps = out.attention.numpy().reshape((*tokens.shape, *self.grid))  # (B, T, H, W)
            for i, n in enumerate(lengths):
                words = self.vocab.decode(tokens[i][:n])
                emitted = min(n + 1, tokens.shape[1])  # the words and `<end>`, if emitted
                captions.append(
                    Caption(
                        text=" ".join(words),
                        words=words,
                        tokens=tokens[i][:n].astype(np.int32),
                        score=float(out.log_prob[i]),
                        attention=maps[i, :emitted],
                        image=np.clip(np.round(chunk[i]), 0, 255).astype(np.uint8),
                        **self._off_world_fields(scores, i),
                        **self._tag_fields(out, i),
                    )
                )
        return captions

    def _tag_fields(self, out, i):
        if self.model.tagger is None:
            return {}
        tag = int(out.tag[i])
        return {
            "tag": self.vocab.words[tag] if tag >= 0 else None,
            "tag_prob": float(out.tag_prob[i]),
        }

    def _off_world_fields(self, scores, i):
        if scores is None:
            return {}
        score = float(scores[i])
        return {"off_world_score": score, "off_world": score > self.off_world.threshold}

    def caption(self, images, beam_size: int | None = None) -> list[Caption]:
        """Captions one image or a list of images.

        Args:
          images: one image or a list (or an (N, H, W, 3) array) of images, each as
            `load_image` takes it.
          beam_size: 1 for greedy decoding, k for beam search; None for the config's.

        Returns:
          a list of `Caption`, one per image, in order (a list of one for one image).

        Raises:
          ValueError: naming the first image that cannot be read, and why.
        """
        batch = list(images) if captions_lib.is_batch(images) else [images]
        if not batch:
            return []
        pixels = np.stack([self.load_image(image, i) for i, image in enumerate(batch)])
        return self.caption_pixels(pixels, beam_size)

    def attend(self, image, captions: Sequence[str | Sequence[str]]) -> list[np.ndarray]:
        """Where the model looks for every word of given captions of one image (teacher
        forcing: each word is predicted from the caption's words before it, not from the
        model's own).

        Args:
          image: one image, as `load_image` takes it.
          captions: texts (split as training splits them: `vocab.tokenize_py`) or word
            lists; words outside the vocabulary are read as `<unk>`.

        Returns:
          per caption a (n + 1, H, W) array for its n words: row t is the attention with
          which the model predicts word t, the last row `<end>`'s; for a caption the model
          says itself, the rows of its `Caption.attention`.
        """
        words = [vocab_lib.tokenize_py([c])[0] if isinstance(c, str) else list(c) for c in captions]
        if not words:
            return []
        features = self._features(tf.constant(self.load_image(image)[None]))
        length = max(len(w) for w in words) + 1
        inputs = np.full((len(words), length), vocab_lib.PAD_ID, np.int32)
        for i, w in enumerate(words):
            inputs[i, : len(w) + 1] = [vocab_lib.START_ID, *self.vocab.ids(w)]
        decoder = self.model.decoder
        use_expected = None
        if decoder.attention == "hard":  # as `step` decodes it: expected context or argmax
            use_expected = tf.fill([len(words)], self.config.hard_decoding == "expected")
        out = decoder(
            tf.repeat(features, len(words), axis=0),
            tf.constant(inputs),
            training=False,
            use_expected=use_expected,
        )
        maps = out["alpha"].numpy().reshape((len(words), length, *self.grid))
        return [maps[i, : len(w) + 1] for i, w in enumerate(words)]

    def attention_figure(self, caption: Caption, path: str | None = None) -> np.ndarray:
        """The picture of where the model looked for every word (paper Fig. 3): the image,
        then a panel per word; for hard attention decoded at argmax α each panel outlines
        the cell it read (`sat_tf.evaluation.visualize.attention_figure`).

        Args:
          caption: a `Caption` of this captioner.
          path: if given, the PNG is written there.

        Returns:
          the picture, (h, w, 3) uint8.
        """
        alphas = caption.attention.reshape(len(caption.attention), -1)  # (M, L)
        shown, points = visualize.caption_panels(
            caption.words, alphas, self.config.decodes_at_a_cell
        )
        return visualize.attention_figure(
            caption.image, shown, alphas, self.grid, hard_points=points, path=path
        )

    def attention_summary(self, caption: Caption) -> str:
        """A text table of where the model looked for each word
        (`sat_tf.evaluation.visualize.attention_summary`)."""
        alphas = caption.attention.reshape(len(caption.attention), -1)  # (M, L)
        shown, _ = visualize.caption_panels(caption.words, alphas, False)
        return visualize.attention_summary(shown, alphas, self.grid)
