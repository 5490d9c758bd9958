// The demo page: sends a photo to POST /api/caption and shows the caption, its
// log-probability and one attention picture per word (computed by the server from the
// SavedModel's outputs), and for a beam the beam's other captions with their
// probabilities: a click on one shows its words and pictures. No library, no network
// beyond this server.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { info: null, page: null, result: null, pinned: null, file: null, request: 0 };

function megabytes(bytes) {
  return (bytes / 2 ** 20).toFixed(1) + " MB";
}

function setState(name) {
  document.body.dataset.state = name;
  $("busy").hidden = name !== "busy";
}

function showMessage(text) {
  $("message").textContent = text;
  $("message").hidden = !text;
}

function selectedBeam() {
  const checked = document.querySelector("input[name=beam_size]:checked");
  return checked ? checked.value : "";
}

async function loadInfo() {
  let info;
  try {
    const response = await fetch("/api/info");
    info = await response.json();
  } catch (error) {
    showMessage("The demo server did not answer (" + error.message + "); is it still running?");
    setState("error");
    return;
  }
  state.info = info;
  const names = info.decodings.map((d) => d.name);
  $("model").textContent =
    `A ${info.model.attention}-attention captioner: ${info.model.image_size} px input, ` +
    `${info.model.grid[0]} \u00d7 ${info.model.grid[1]} attention grid, ` +
    `${info.model.vocab_size} words.`;
  $("limits").textContent =
    `JPEG, PNG, GIF, BMP or WebP, up to ${megabytes(info.limits.max_bytes)}, ` +
    `${info.limits.max_pixels / 1e6} megapixels and sides up to ${info.limits.max_aspect}:1`;
  for (const [i, decoding] of info.decodings.entries()) {
    const label = document.createElement("label");
    const input = document.createElement("input");
    input.type = "radio";
    input.name = "beam_size";
    input.value = String(decoding.beam_size);
    input.checked = i === 0;
    input.addEventListener("change", () => state.file && caption(state.file));
    label.append(input, " " + decoding.name);
    label.title = decoding.export;
    $("decodings").append(label);
  }
  $("decoding-note").textContent =
    names.length > 1
      ? `Each decoding is its own SavedModel: ${names.join(" and ")}.`
      : `This export decodes with ${names[0]} only: the beam size is fixed when a model ` +
        "is exported (export/export.py --beam_size), so start the demo with a second " +
        "export or with --workdir to offer both.";
  for (const sample of info.samples) {
    const button = document.createElement("button");
    const image = document.createElement("img");
    image.src = sample.url;
    image.alt = sample.name;
    button.title = sample.name;
    button.type = "button";
    button.append(image);
    button.addEventListener("click", () => captionSample(sample));
    $("samples").append(button);
  }
  $("samples").hidden = info.samples.length === 0;
  setState("idle");
}

async function captionSample(sample) {
  const response = await fetch(sample.url);
  const blob = await response.blob();
  caption(new File([blob], sample.name, { type: blob.type }));
}

async function caption(file) {
  state.file = file;
  const request = ++state.request;
  showMessage("");
  const limit = state.info.limits.max_bytes;
  if (file.size > limit) {
    showMessage(`${file.name} is ${megabytes(file.size)}; the demo takes images up to ${megabytes(limit)}`);
    setState("error");
    return;
  }
  const form = new FormData();
  form.append("image", file, file.name);
  form.append("beam_size", selectedBeam());
  setState("busy");
  let response, body;
  try {
    response = await fetch("/api/caption", { method: "POST", body: form });
    body = await response.json();
  } catch (error) {
    if (request === state.request) {
      showMessage(`Captioning ${file.name} failed: the server did not answer (${error.message})`);
      setState("error");
    }
    return;
  }
  if (request !== state.request) return;
  if (!response.ok) {
    showMessage(body.error || `Captioning ${file.name} failed (HTTP ${response.status})`);
    setState("error");
    return;
  }
  render(body);
  setState("done");
}

function wordSpan(word, index) {
  const span = document.createElement("span");
  span.className = "word";
  span.textContent = word;
  span.dataset.index = String(index);
  span.addEventListener("mouseenter", () => show(index));
  span.addEventListener("mouseleave", () => show(state.pinned));
  span.addEventListener("click", () => pin(index));
  return span;
}

function probability(p) {
  return p >= 0.001 ? p.toFixed(3) : p.toExponential(1);
}

// The answer of /api/caption: the list of the beam's captions, then the first shown.
function render(page) {
  state.page = page;
  const list = $("alternatives");
  list.replaceChildren();
  page.alternatives.forEach((alternative, i) => {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "alternative";
    button.dataset.alternative = String(i);
    const odds = document.createElement("small");
    odds.textContent = ` p = ${probability(alternative.probability)} (log p ${alternative.log_prob.toFixed(3)})`;
    button.append(alternative.caption || "(no words)", odds);
    button.addEventListener("click", () => choose(i));
    const item = document.createElement("li");
    item.append(button);
    list.append(item);
  });
  $("alternatives-box").hidden = page.alternatives.length < 2;
  choose(0);
}

// Shows the page's caption `index` (0: the best) with its words and pictures.
function choose(index) {
  document.querySelectorAll(".alternative").forEach((button) => {
    button.classList.toggle("chosen", button.dataset.alternative === String(index));
  });
  showCaption({ ...state.page, ...state.page.alternatives[index] });
}

function showCaption(result) {
  state.result = result;
  state.pinned = null;
  const words = result.words;
  const spoken = result.caption ? result.caption.split(" ").length : 0;
  const caption = $("caption");
  const end = $("end");
  caption.replaceChildren();
  end.replaceChildren();
  words.forEach((word, i) => {
    const target = i < spoken ? caption : end;
    if (i > 0 && i < spoken) target.append(" ");
    target.append(wordSpan(word, i));
  });
  caption.dataset.caption = result.caption;
  $("score").textContent =
    (result.tag ? `tag: ${result.tag}; ` : "") +
    `log p = ${result.log_prob.toFixed(3)} (${result.decoding}; model ${Math.round(result.model_ms)} ms, ` +
    `page ${Math.round(result.total_ms)} ms)` +
    (result.off_world_score === null ? "" : `; off-world score ${result.off_world_score.toFixed(2)}`);
  const offWorld = $("off-world");
  offWorld.hidden = !result.off_world;
  offWorld.textContent = result.off_world
    ? `An off-world photo (score ${result.off_world_score.toFixed(2)}, over ` +
      `${result.off_world_threshold.toFixed(2)}): unlike the photos the model learnt from, ` +
      "so the caption is likely wrong."
    : "";
  const strip = $("strip");
  strip.replaceChildren(figure(result.image, result.file, null));
  words.forEach((word, i) => strip.append(figure(result.attention[i], word, i)));
  $("result").hidden = false;
  show(null);
}

function figure(source, title, index) {
  const fig = document.createElement("figure");
  const image = document.createElement("img");
  const text = document.createElement("figcaption");
  image.src = source;
  image.alt = index === null ? "the photo" : `attention for "${title}"`;
  text.textContent = title;
  text.title = title;
  fig.append(image, text);
  if (index !== null) {
    fig.dataset.index = String(index);
    fig.addEventListener("mouseenter", () => show(index));
    fig.addEventListener("mouseleave", () => show(state.pinned));
    fig.addEventListener("click", () => pin(index));
  }
  return fig;
}

function show(index) {
  const result = state.result;
  if (!result) return;
  const picture = $("picture");
  const cell = $("cell");
  document.querySelectorAll(".active").forEach((e) => e.classList.remove("active"));
  if (index === null || index === undefined) {
    picture.src = result.image;
    picture.dataset.index = "";
    cell.hidden = true;
    $("showing").textContent = `${result.file}: the centre crop the model captions.`;
    return;
  }
  picture.src = result.attention[index];
  picture.dataset.index = String(index);
  document.querySelectorAll(`[data-index="${index}"]`).forEach((e) => {
    if (e !== picture) e.classList.add("active");
  });
  $("showing").textContent = `Where the model looked for \u201c${result.words[index]}\u201d.`;
  if (result.cells) {
    const [row, col] = result.cells[index];
    const [rows, cols] = result.grid;
    const frame = $("frame");
    cell.style.left = `${(col / cols) * frame.clientWidth}px`;
    cell.style.top = `${(row / rows) * frame.clientHeight}px`;
    cell.style.width = `${frame.clientWidth / cols}px`;
    cell.style.height = `${frame.clientHeight / rows}px`;
    cell.hidden = false;
  } else {
    cell.hidden = true;
  }
}

function pin(index) {
  state.pinned = state.pinned === index ? null : index;
  document.querySelectorAll(".pinned").forEach((e) => e.classList.remove("pinned"));
  if (state.pinned !== null) {
    document.querySelectorAll(`.word[data-index="${index}"]`).forEach((e) => e.classList.add("pinned"));
  }
  show(state.pinned);
}

$("file").addEventListener("change", (event) => {
  const file = event.target.files[0];
  if (file) caption(file);
  event.target.value = "";
});

const drop = $("drop");
drop.addEventListener("dragover", (event) => {
  event.preventDefault();
  drop.classList.add("over");
});
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (event) => {
  event.preventDefault();
  drop.classList.remove("over");
  const file = event.dataTransfer.files[0];
  if (file) caption(file);
});

loadInfo();
