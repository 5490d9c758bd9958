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
(`sat_tf.serving.off_world`), how unlike its training photos the photo is. With
`num_captions=k` it returns the beam's k best captions of each image, or with
`sample=True` k captions drawn from the model (temperature, nucleus, seed);
`Captioner.score` gives the log-probability of any caption of a photo, for re-ranking.
"""

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sat_tf.data import image_io
from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation import visualize
from sat_tf.model import losses
from sat_tf.serving import captions as captions_lib
from sat_tf.serving import inference, litert_cache
from sat_tf.serving import off_world as off_world_lib
from sat_tf.serving.captions import Caption
from sat_tf.serving.inference import feature_encoder


def _drawing(temperature, top_p, seed):
    """The checked (seed entropy, temperature, top_p) of a draw.

    Raises:
      ValueError: for a bad value.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise ValueError(f"temperature={temperature!r} must be a positive number")
    if not 0 < temperature < float("inf"):
        raise ValueError(f"temperature={temperature!r} must be a positive number")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r} must lie in (0, 1]")
    if seed is None:
        seed = np.random.SeedSequence().entropy
    entropy = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    if not entropy or any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in entropy):
        raise ValueError(f"seed={seed!r} must be a non-negative int (or a list of them)")
    return entropy, float(temperature), float(top_p)


def _draw_arguments(drawing, start):
    """`make_caption_fn`'s `sampling` of the images from `start` on: their stateless
    seed from the call's entropy and `start`."""
    entropy, temperature, top_p = drawing
    seed = np.random.SeedSequence([*entropy, start]).generate_state(2).view(np.int32)
    arguments = {"sample_seed": tf.constant(seed), "temperature": tf.constant(temperature)}
    if top_p < 1:
        arguments["top_p"] = tf.constant(top_p)
    return arguments


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

            captioner = litert.from_source(
                "preset", source, runtime, cache_dir, tensorflow=tensorflow_loader, **kwargs
            )
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

            captioner = litert.from_source(
                "workdir", workdir, runtime, tensorflow=tensorflow_loader, **kwargs
            )
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

    def _caption_fn(self, beam_size, num_captions=1, sample=False):
        """A `tf.function` of (pixels, sampling) -> (`Generated`, off-world score or
        None); `sampling` as `make_caption_fn` takes it."""
        key = (beam_size, num_captions, sample)
        if key not in self._caption_fns:
            decode = inference.make_caption_fn(
                self.model, self.config, beam_size, None, self.vocab, num_captions, sample
            )
            stats = self.off_world

            @tf.function(reduce_retracing=True, autograph=False)
            def caption(pixels, sampling=None):
                features = self._features(pixels)
                scores = None if stats is None else off_world_lib.score(features, stats)[0]
                return decode({"features": features}, sampling), scores

            self._caption_fns[key] = caption
        return self._caption_fns[key]

    def caption_pixels(
        self,
        pixels: np.ndarray,
        beam_size: int | None = None,
        num_captions: int = 1,
        sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list:
        """Captions images already at the model's geometry (`load_image`).

        Args:
          pixels: (N, S, S, 3) float pixels in [0, 255].
          beam_size, num_captions, sample, temperature, top_p, seed: as `caption`.

        Returns:
          as `caption`.
        """
        if beam_size is not None and beam_size < 1:
            raise ValueError(f"beam_size={beam_size} must be at least 1 (None: the model's)")
        if not sample and (temperature, top_p, seed) != (1.0, 1.0, None):
            raise ValueError("temperature, top_p and seed draw captions: pass sample=True")
        drawing = _drawing(temperature, top_p, seed) if sample else None
        pixels = np.asarray(pixels, np.float32)
        size = self.image_size
        if pixels.ndim != 4 or pixels.shape[1:] != (size, size, 3):
            raise ValueError(f"pixels must be (N, {size}, {size}, 3); got {pixels.shape}")
        captions = []
        caption = self._caption_fn(beam_size, num_captions, sample)
        for start in range(0, len(pixels), self.batch_size):
            chunk = pixels[start : start + self.batch_size]
            arguments = None if drawing is None else _draw_arguments(drawing, start)
            out, scores = caption(tf.constant(chunk), arguments)
            captions.extend(self._captions(out, scores, chunk, num_captions))
        return captions

    def _captions(self, out, scores, chunk, num_captions):
        """Per image of a chunk its `Caption` (num_captions 1) or list of them."""
        fields = [x.numpy() for x in (out.tokens, out.length, out.log_prob, out.attention)]
        if num_captions == 1:
            fields = [x[:, None] for x in fields]
        tokens, lengths, log_probs, attention = fields
        maps = attention.reshape((*tokens.shape, *self.grid))  # (B, n, T, H, W)
        made = []
        for i in range(len(chunk)):
            photo = {
                "image": np.clip(np.round(chunk[i]), 0, 255).astype(np.uint8),
                **self._off_world_fields(scores, i),
                **self._tag_fields(out, i),
            }
            found = [
                self._caption(tokens[i, j], lengths[i, j], log_probs[i, j], maps[i, j], photo)
                for j in range(tokens.shape[1])
                if j == 0 or log_probs[i, j] > -np.inf
            ]
            made.append(found if num_captions > 1 else found[0])
        return made

    def _caption(self, tokens, length, log_prob, maps, photo):
        words = self.vocab.decode(tokens[:length])
        emitted = min(length + 1, len(tokens))  # the words and `<end>`, if emitted
        return Caption(
            text=" ".join(words),
            words=words,
            tokens=tokens[:length].astype(np.int32),
            score=float(log_prob),
            attention=maps[:emitted],
            **photo,
        )

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

    def caption(
        self,
        images,
        beam_size: int | None = None,
        num_captions: int = 1,
        sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | Sequence[int] | None = None,
    ) -> list:
        """Captions one image or a list of images.

        Args:
          images: one image or a list (or an (N, H, W, 3) array) of images, each as
            `load_image` takes it.
          beam_size: 1 for greedy decoding, k for beam search; None for the config's.
          num_captions: k, captions per image. k > 1 gives the beam's k best captions
            of each image, distinct, best first, the first the caption of k = 1; a beam
            narrower than k is widened to k for this call (the first may then differ
            from the narrower beam's caption). Best first is the beam's ranking: the
            score divided by the length penalty ((5 + n) / 6)^α of the caption's n
            tokens, `<end>` included (α the config's length_penalty; 0 ranks by
            score). An image gets fewer where the search holds fewer (with a tag to
            say, only those that say it).
          sample: draw the captions word by word from the model instead of searching
            (beam_size must be left out): k drawn captions per image, ordered by
            score, possibly some alike. The decoding rules hold as for greedy
            decoding: blocked words stay blocked, and a confident tag is said (each
            word then drawn by a beam of one hypothesis with the tag and one without,
            `sampling.perturb`).
          temperature: the draw's temperature, > 0: towards 0 every draw is the
            greedy caption (beam_size 1), above 1 flatter than the model.
          top_p: in (0, 1]: draw each word from its nucleus, the fewest most likely
            words whose probability reaches top_p (Holtzman et al., 2020).
          seed: a non-negative int (or a list of them) that makes the draws
            reproducible: the same images in the same order, with the same
            batch_size, give the same captions; None draws a fresh seed.

        Returns:
          per image, in order (a list of one for one image): a `Caption` for
          num_captions 1, else a list of `Caption`s.

        Raises:
          ValueError: naming the first image that cannot be read, and why; for a bad
            decoding argument.
        """
        batch = list(images) if captions_lib.is_batch(images) else [images]
        if not batch:
            return []
        pixels = np.stack([self.load_image(image, i) for i, image in enumerate(batch)])
        drawing = dict(sample=sample, temperature=temperature, top_p=top_p, seed=seed)
        return self.caption_pixels(pixels, beam_size, num_captions, **drawing)

    def score(self, images, captions) -> list:
        """log p(caption | image) of given captions, under teacher forcing: the sum of
        the log-probabilities of the caption's words and of `<end>` after them, the
        quantity `Caption.score` holds (for a caption that ended with `<end>`). It is
        the model's probability whatever the decoding rules would allow: a caption
        decoding never makes (a repeated trigram, a bad ending) gets one too.

        Args:
          images: one image or a list of them, as `caption` takes them.
          captions: per image (for one image: itself) a text or a list of texts, split
            as training splits them (`vocab.tokenize_py`: lower case, no punctuation).

        Returns:
          per image (a list of one for one image) a float for a text, a list of
          floats for a list of texts.

        Raises:
          ValueError: for captions that do not pair with the images, a caption that is
            not a text, words outside the vocabulary (named), or an image that cannot
            be read.
        """
        batch = list(images) if captions_lib.is_batch(images) else [images]
        entries = [captions] if not captions_lib.is_batch(images) else captions
        if not isinstance(entries, (list, tuple)) or len(entries) != len(batch):
            raise ValueError(
                f"{len(batch)} images take a list of {len(batch)} captions (a text or a "
                f"list of texts per image); got {type(captions).__name__}"
                + (f" of {len(entries)}" if isinstance(entries, (list, tuple)) else "")
            )
        words = [
            self._known_words(entry, image, i)
            for i, (image, entry) in enumerate(zip(batch, entries, strict=True))
        ]
        scores = []
        for start in range(0, len(batch), self.batch_size):
            chunk = batch[start : start + self.batch_size]
            pixels = np.stack([self.load_image(image, start + i) for i, image in enumerate(chunk)])
            rows = [(i, w) for i, ws in enumerate(words[start : start + len(chunk)]) for w in ws]
            found = iter([])
            if rows:
                features = tf.gather(self._features(tf.constant(pixels)), [i for i, _ in rows])
                found = iter(self._log_likelihood(features, [w for _, w in rows]).tolist())
            scores.extend([next(found) for _ in ws] for ws in words[start : start + len(chunk)])
        return [s[0] if isinstance(e, str) else s for s, e in zip(scores, entries, strict=True)]

    def _known_words(self, entry, image, index):
        """The word lists of an image's text or list of texts.

        Raises:
          ValueError: for a caption that is not a text, or words outside the vocabulary.
        """
        texts = [entry] if isinstance(entry, str) else entry
        what = captions_lib.describe(image, index)
        if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
            raise ValueError(
                f"captions of image {what}: give a text or a list of texts, not {entry!r}"
            )
        words = vocab_lib.tokenize_py(list(texts))
        for text, ws in zip(texts, words, strict=True):
            unknown = [
                w for w, i in zip(ws, self.vocab.ids(ws), strict=True) if i == vocab_lib.UNK_ID
            ]
            if unknown:
                raise ValueError(
                    f"caption {text!r} of image {what} holds words outside "
                    f"the model's vocabulary of {len(self.vocab):,} words: "
                    + ", ".join(map(repr, dict.fromkeys(unknown)))
                )
        return words

    def _teacher_forced(self, features, words):
        """The decoder's teacher-forced outputs ({"logits", "alpha"}, `AttentionDecoder.call`)
        for word lists, `features` (N, L, D) a row for each, and its (N, n + 1) targets
        `w1 .. wn <end>` padded with `<pad>`. Hard attention attends as it decodes
        (`config.hard_decoding`)."""
        length = max(len(w) for w in words) + 1
        captions = np.full((len(words), length + 1), vocab_lib.PAD_ID, np.int32)
        for i, w in enumerate(words):
            captions[i, : len(w) + 2] = [vocab_lib.START_ID, *self.vocab.ids(w), vocab_lib.END_ID]
        decoder = self.model.decoder
        use_expected = None
        if decoder.attention == "hard":  # as `step` decodes it: expected context or argmax
            use_expected = tf.fill([len(words)], self.config.hard_decoding == "expected")
        out = decoder(
            features, tf.constant(captions[:, :-1]), training=False, use_expected=use_expected
        )
        return out, captions[:, 1:]

    def _log_likelihood(self, features, words):
        """(N,) numpy log p(words, `<end>`) of word lists, `features` a row for each."""
        out, targets = self._teacher_forced(features, words)
        mask = tf.cast(targets != vocab_lib.PAD_ID, tf.float32)
        return tf.reduce_sum(losses.word_log_likelihood(out["logits"], targets, mask), 1).numpy()

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
        out, targets = self._teacher_forced(tf.repeat(features, len(words), axis=0), words)
        maps = out["alpha"].numpy().reshape((*targets.shape, *self.grid))
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


def tensorflow_loader(source, **kwargs):
    """A function that loads the TensorFlow `Captioner` of `source` (a
    `litert.Source`; its config's decoding kept), for `LiteRTCaptioner(tensorflow=...)`:
    what LiteRT cannot do (another decoding, sampling) goes to it."""

    def load():
        trained = inference.load(source.directory, kind=source.kind)
        config = dataclasses.replace(trained.config, **litert_cache.decoding(source.config))
        return Captioner.from_trained(trained._replace(config=config), **kwargs)

    return load
