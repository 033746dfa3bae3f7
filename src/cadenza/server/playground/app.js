// Cadenza playground: speaks through the server's own API, as any client would.
//   GET /v1/models            models and their capabilities (which fields to show)
//   GET/POST/DELETE /v1/audio/voices   saved voices (upload or recording, transcript, consent)
//   WS /v1/audio/speech/stream         Play: 16-bit PCM frames scheduled with Web Audio as they arrive
//   POST /v1/audio/speech             Play at speed != 1 (the WebSocket has no speed), and Download (any format)
//   POST /v1/audio/voice-conversion   Convert: a recording said in the picked voice (models with voice_conversion)
//   WS /v1/audio/voice-conversion/stream   Convert as I speak: the microphone as 16-bit PCM frames, the converted
//                                          audio played as it comes
// The API key lives in this browser's localStorage; requests send it as "Authorization: Bearer", the WebSocket as
// the subprotocol "cadenza.key.<base64url of the key>" (browsers cannot set headers on a WebSocket).
// For tests and the curious, window.cadenzaPlayground.stats mirrors what the page shows.

const KEY_STORAGE = "cadenza.apiKey";
const WS_PATH = "/v1/audio/speech/stream";
const LIVE_PATH = "/v1/audio/voice-conversion/stream";
const LIVE_FRAME = 4096;      // microphone samples per frame sent (~85 ms at 48 kHz)
const LEAD_S = 0.05;          // schedule each chunk at least this far ahead of the audio clock
const PEAK_BLOCK_S = 0.01;    // waveform resolution: one min/max pair per 10 ms
const MIN_WAVE_S = 5;         // the waveform spans at least this many seconds, then compresses
const MAX_RECORD_S = 30;      // the server's longest voice recording

const $ = (id) => document.getElementById(id);

const stats = {
  state: "loading",   // loading | ready | connecting | playing | done | error
  frames: 0,          // binary audio messages (or HTTP body chunks) received
  samples: 0,
  seconds: 0,         // audio received, in seconds
  sampleRate: null,
  firstAudioMs: null, // text sent -> first audio received, measured here
  serverFirstAudioS: null,
  underruns: 0,       // chunks that arrived after the audio before them had finished playing
  lastError: null,
  voices: 0,
  models: 0,
  conversions: 0,     // recordings converted (Convert), and the last one's length in seconds
  convertedSeconds: null,
  liveConversions: 0, // live conversions finished (Convert as I speak): microphone seconds sent, audio back
  liveSentSeconds: 0,
  liveReceivedSeconds: 0,
};

let models = [];
let voices = [];
let session = null;     // the playback in progress: {socket?, abort?, player, waveform}
let audioContext = null;
let recorded = null;    // Blob of the last recording
let recorder = null;
let live = null;        // the live conversion in progress: {socket, stream, source, processor, player}

// ---- errors and status --------------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(message, param = null, status = null) {
    super(message);
    this.param = param;
    this.status = status;
  }
}

function showError(error) {
  const message = error instanceof ApiError && error.param ? `${error.param}: ${error.message}` : String(error.message || error);
  stats.lastError = message;
  $("error").textContent = message;
  $("error").hidden = false;
  render();
}

function clearError() {
  stats.lastError = null;
  $("error").hidden = true;
  $("error").textContent = "";
}

function setState(state) {
  stats.state = state;
  render();
}

function render() {
  const status = $("status");
  status.textContent = stats.state;
  status.dataset.state = stats.state;
  status.dataset.frames = stats.frames;
  status.dataset.seconds = stats.seconds.toFixed(3);
  status.dataset.firstAudioMs = stats.firstAudioMs ?? "";
  status.dataset.error = stats.lastError ?? "";
  $("stat-frames").textContent = stats.frames ? String(stats.frames) : "–";
  $("stat-seconds").textContent = stats.samples ? `${stats.seconds.toFixed(2)} s` : "–";
  $("stat-rate").textContent = stats.sampleRate ? `${stats.sampleRate} Hz` : "–";
  let first = stats.firstAudioMs === null ? "–" : `${Math.round(stats.firstAudioMs)} ms`;
  if (stats.serverFirstAudioS !== null) first += ` (server ${Math.round(stats.serverFirstAudioS * 1000)} ms)`;
  $("stat-first").textContent = first;
  const busy = stats.state === "connecting" || stats.state === "playing";
  const loaded = models.length > 0;
  $("play").disabled = busy || !loaded;
  $("download").disabled = busy || !loaded;
  $("stop").disabled = !busy;
}

// ---- the API ------------------------------------------------------------------------------------------------------

function apiKey() {
  return $("api-key").value.trim();
}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
  let response;
  try {
    response = await fetch(path, { ...options, headers });
  } catch (error) {
    throw new ApiError(`cannot reach the server (${error.message})`);
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    let param = null;
    try {
      const body = await response.json();
      if (body && body.error) ({ message, param } = body.error);
    } catch { /* not JSON: keep the status line */ }
    throw new ApiError(message, param, response.status);
  }
  return response;
}

function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function selectedModel() {
  return models.find((m) => m.id === $("model").value) || models[0];
}

// ---- models and voices --------------------------------------------------------------------------------------------

async function loadModels() {
  const body = await (await api("/v1/models")).json();
  models = body.data;
  stats.models = models.length;
  const select = $("model");
  const previous = select.value;
  select.replaceChildren(...models.map((m) => new Option(`${m.id} (${m.capabilities.title})`, m.id)));
  if (models.some((m) => m.id === previous)) select.value = previous;
  applyCapabilities();
}

async function loadVoices() {
  voices = await (await api("/v1/audio/voices")).json();
  stats.voices = voices.length;
  const tbody = $("voice-table").querySelector("tbody");
  tbody.replaceChildren(...voices.map((v) => {
    const row = document.createElement("tr");
    row.dataset.voiceId = v.id;
    const name = document.createElement("td");
    name.textContent = v.name;
    const family = document.createElement("td");
    family.textContent = v.family;
    const cell = document.createElement("td");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "small";
    remove.textContent = "Delete";
    remove.addEventListener("click", () => deleteVoice(v));
    cell.append(remove);
    row.append(name, family, cell);
    return row;
  }));
  $("voice-table").hidden = voices.length === 0;
  $("no-voices").hidden = voices.length !== 0;
  fillVoiceSelect();
}

function fillVoiceSelect(prefer = null) {
  const model = selectedModel();
  const select = $("voice");
  const previous = prefer ?? select.value;
  const options = [];
  if (!model || model.capabilities.default_voice) options.push(new Option("the model's own voice", ""));
  else options.push(new Option("pick a saved voice", ""));
  for (const v of voices) {
    if (model && v.family !== model.capabilities.family) continue; // a voice belongs to one family
    options.push(new Option(v.name, v.id));
  }
  select.replaceChildren(...options);
  if ([...select.options].some((o) => o.value === previous)) select.value = previous;
  render();
}

// What the selected model can do decides which fields are there.
function applyCapabilities() {
  const model = selectedModel();
  if (!model) return;
  const caps = model.capabilities;
  $("speed-field").hidden = !caps.speed;
  if (caps.speed) {
    $("speed").min = caps.speed[0];
    $("speed").max = caps.speed[1];
  } else {
    $("speed").value = 1;
  }
  const instructions = { instruct: "Style instruction", voice_design: "Voice description" }[caps.instructions];
  $("instructions-field").hidden = !instructions;
  $("instructions-label").textContent = instructions || "Instructions";
  $("instructions").placeholder = caps.instructions === "voice_design"
    ? "a warm, low female voice, speaking slowly" : "speak cheerfully";
  $("cloning-field").hidden = caps.cloning_modes.length === 0;
  $("voice-cloning").replaceChildren(...caps.cloning_modes.map((c) => new Option(c, c)));
  $("convert").hidden = !caps.modes.includes("voice_conversion");
  fillVoiceSelect();
}

async function refresh() {
  clearError();
  setState("loading");
  try {
    await loadModels();
    await loadVoices();
    setState("ready");
  } catch (error) {
    models = [];
    setState("error");
    showError(error.status === 401 ? new ApiError(`${error.message} — enter the server's API key above`) : error);
  }
}

// ---- playback -----------------------------------------------------------------------------------------------------

// Plays 16-bit little-endian mono PCM as it arrives: each chunk becomes an AudioBuffer started right where the
// previous one ends (or just ahead of the clock, when it came late).
class PcmPlayer {
  constructor(context, sampleRate, onSamples) {
    this.context = context;
    this.sampleRate = sampleRate;
    this.onSamples = onSamples;
    this.next = 0;
    this.started = null;  // audio-clock time of the first sample
    this.sources = new Set();
    this.odd = null;      // a byte left over from a chunk of odd length
  }

  push(bytes) {
    if (this.odd !== null) {
      const joined = new Uint8Array(bytes.length + 1);
      joined[0] = this.odd;
      joined.set(bytes, 1);
      bytes = joined;
      this.odd = null;
    }
    if (bytes.length % 2) {
      this.odd = bytes[bytes.length - 1];
      bytes = bytes.subarray(0, bytes.length - 1);
    }
    const n = bytes.length / 2;
    if (n === 0) return;
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const samples = new Float32Array(n);
    for (let i = 0; i < n; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    this.onSamples(samples);
    const buffer = this.context.createBuffer(1, n, this.sampleRate);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const now = this.context.currentTime;
    if (this.started !== null && this.next < now) stats.underruns += 1;
    const at = Math.max(this.next, now + LEAD_S);
    if (this.started === null) this.started = at;
    source.start(at);
    source.addEventListener("ended", () => this.sources.delete(source));
    this.sources.add(source);
    this.next = at + n / this.sampleRate;
  }

  stop() {
    for (const source of this.sources) source.stop();
    this.sources.clear();
  }
}

// Min/max per 10 ms of the audio received, drawn as it grows, with the playing position.
class Waveform {
  constructor(canvas) {
    this.canvas = canvas;
    this.peaks = [];
    this.block = 1;
    this.current = null;  // [min, max, count] of the block being filled
    this.player = null;
  }

  reset(sampleRate, player) {
    this.peaks = [];
    this.block = Math.max(1, Math.round(sampleRate * PEAK_BLOCK_S));
    this.current = null;
    this.player = player;
  }

  add(samples) {
    for (const s of samples) {
      if (this.current === null) this.current = [s, s, 0];
      const c = this.current;
      if (s < c[0]) c[0] = s;
      if (s > c[1]) c[1] = s;
      if (++c[2] === this.block) {
        this.peaks.push(c);
        this.current = null;
      }
    }
  }

  draw() {
    const { canvas } = this;
    const g = canvas.getContext("2d");
    const width = canvas.width;
    const height = canvas.height;
    const mid = height / 2;
    g.clearRect(0, 0, width, height);
    g.fillStyle = getComputedStyle(canvas).getPropertyValue("--wave-line") || "#555";
    g.fillRect(0, mid, width, 1);
    const peaks = this.current ? [...this.peaks, this.current] : this.peaks;
    // Scaled to the loudest so far: quiet speech still shows its shape.
    let loudest = 0.05;
    for (const p of peaks) loudest = Math.max(loudest, -p[0], p[1]);
    const scale = (mid - 2) / loudest;
    const span = Math.max(peaks.length, MIN_WAVE_S / PEAK_BLOCK_S);
    const perPixel = span / width;
    g.fillStyle = getComputedStyle(canvas).getPropertyValue("--wave") || "#2a7";
    for (let x = 0; x < width; x++) {
      const from = Math.floor(x * perPixel);
      const to = Math.min(peaks.length, Math.max(from + 1, Math.floor((x + 1) * perPixel)));
      if (from >= peaks.length) break;
      let lo = 0;
      let hi = 0;
      for (let i = from; i < to; i++) {
        lo = Math.min(lo, peaks[i][0]);
        hi = Math.max(hi, peaks[i][1]);
      }
      g.fillRect(x, mid - hi * scale, 1, Math.max(1, (hi - lo) * scale));
    }
    const player = this.player;
    if (player && player.started !== null) {
      const played = (player.context.currentTime - player.started) / PEAK_BLOCK_S;
      if (played > 0 && played <= peaks.length) {
        g.fillStyle = getComputedStyle(canvas).getPropertyValue("--playhead") || "#d33";
        g.fillRect(Math.round(played / perPixel), 0, 2, height);
      }
    }
  }
}

const waveform = new Waveform($("wave"));

window.cadenzaPlayground = {
  stats,
  // Seconds of the received audio the audio clock has played through so far.
  playedSeconds() {
    const player = waveform.player;
    if (!player || player.started === null) return 0;
    return Math.max(0, Math.min(player.context.currentTime, player.next) - player.started);
  },
};

function animate() {
  waveform.draw();
  const player = waveform.player;
  if (session || (player && player.context.currentTime < player.next)) requestAnimationFrame(animate);
}

function context() {
  // Created on the first click: browsers start audio only after a user gesture.
  if (audioContext === null) audioContext = new AudioContext();
  return audioContext;
}

function resetStats() {
  Object.assign(stats, { frames: 0, samples: 0, seconds: 0, sampleRate: null, firstAudioMs: null,
    serverFirstAudioS: null, underruns: 0 });
}

function startPlayer(sampleRate) {
  stats.sampleRate = sampleRate;
  const player = new PcmPlayer(context(), sampleRate, (samples) => {
    stats.samples += samples.length;
    stats.seconds = stats.samples / sampleRate;
    waveform.add(samples);
  });
  waveform.reset(sampleRate, player);
  requestAnimationFrame(animate);
  return player;
}

function received(bytes, sent) {
  if (!session || !session.player) return;
  if (stats.firstAudioMs === null) stats.firstAudioMs = performance.now() - sent;
  stats.frames += 1;
  session.player.push(bytes);
  render();
}

function speechFields() {
  const model = selectedModel();
  const fields = { model: model.id };
  const voice = $("voice").value;
  if (voice) fields.voice = { id: voice };
  const instructions = $("instructions").value.trim();
  if (!$("instructions-field").hidden && instructions) fields.instructions = instructions;
  const seed = $("seed").value.trim();
  if (seed !== "") fields.seed = Number(seed);
  const speed = Number($("speed").value);
  return { fields, speed: $("speed-field").hidden || !Number.isFinite(speed) ? 1 : speed };
}

async function play() {
  stop();
  clearError();
  resetStats();
  $("result").hidden = true;
  const text = $("text").value;
  const { fields, speed } = speechFields();
  await context().resume();
  setState("connecting");
  if (speed !== 1) return playHttp(text, fields, speed);  // the WebSocket has no speed: whole segments over HTTP
  const socket = new WebSocket(...socketUrl(WS_PATH));
  socket.binaryType = "arraybuffer";
  const current = { socket, player: null, done: false, failed: false };
  session = current;
  let sent = 0;
  socket.addEventListener("open", () => {
    socket.send(JSON.stringify({ type: "session.config", ...fields }));
    socket.send(JSON.stringify({ type: "input.text", text }));
    socket.send(JSON.stringify({ type: "input.done" }));
    sent = performance.now();
  });
  socket.addEventListener("message", (event) => {
    if (session !== current) return;
    if (typeof event.data !== "string") {
      received(new Uint8Array(event.data), sent);
      return;
    }
    const message = JSON.parse(event.data);
    if (message.type === "audio.start") {
      current.player = startPlayer(message.sample_rate);
      setState("playing");
    } else if (message.type === "audio.done") {
      current.done = true;
      stats.serverFirstAudioS = message.first_chunk_seconds;
    } else if (message.type === "error") {
      current.failed = true;
      const { message: text, param } = message.error;
      showError(new ApiError(text, param));
    }
  });
  socket.addEventListener("close", (event) => {
    if (session !== current) return;
    session = null;
    if (!current.done && !current.failed) {
      // Refused at the handshake (wrong key, another origin) or the connection dropped: browsers give no reason.
      showError(new ApiError(event.code === 1006 && !current.player
        ? "the server refused the connection (is the API key right?)"
        : `the connection closed before the audio was done (code ${event.code})`));
    }
    setState(current.done ? "done" : "error");
  });
}

async function playHttp(text, fields, speed) {
  const abort = new AbortController();
  const current = { abort, player: null };
  session = current;
  const sent = performance.now();
  try {
    const response = await api("/v1/audio/speech", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...fields, input: text, speed, response_format: "pcm" }),
      signal: abort.signal,
    });
    current.player = startPlayer(Number(response.headers.get("X-Sample-Rate")));
    setState("playing");
    const reader = response.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (session === current) received(value, sent);
    }
    if (session === current) setState("done");
  } catch (error) {
    if (session === current && error.name !== "AbortError") {
      showError(error);
      setState("error");
    }
  } finally {
    if (session === current) session = null;
    render();
  }
}

function stop() {
  if (!session) return;
  const current = session;
  session = null;
  if (current.socket) current.socket.close(1000);
  if (current.abort) current.abort.abort();
  if (current.player) current.player.stop();
  setState("done");
}

async function download() {
  clearError();
  const { fields, speed } = speechFields();
  const format = $("format").value;
  setState("connecting");
  try {
    const response = await api("/v1/audio/speech", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...fields, input: $("text").value, speed, response_format: format, stream: false }),
    });
    const blob = await response.blob();
    const url = URL.createObjectURL(blob);
    const previous = $("result-link").href;
    if (previous.startsWith("blob:")) URL.revokeObjectURL(previous);
    $("result-link").href = url;
    $("result-link").download = `speech.${format}`;
    $("result-link").textContent = `Save speech.${format} (${(blob.size / 1024).toFixed(0)} KiB)`;
    $("result-audio").hidden = format === "pcm";  // raw samples: nothing a browser plays
    $("result-audio").src = format === "pcm" ? "" : url;
    $("result").hidden = false;
    setState("done");
  } catch (error) {
    showError(error);
    setState("error");
  }
}

// ---- voice conversion ---------------------------------------------------------------------------------------------

async function convert() {
  clearError();
  const file = $("convert-file").files[0];
  if (!file) return showError(new ApiError("choose the recording to convert", "audio"));
  const form = new FormData();
  form.append("audio", file, file.name);
  form.append("model", selectedModel().id);
  if ($("voice").value) form.append("voice", $("voice").value);
  const text = $("convert-text").value.trim();
  if (text) form.append("source_text", text);
  form.append("response_format", "wav");
  form.append("stream", "false");
  $("convert-run").disabled = true;
  $("convert-message").textContent = "Converting…";
  try {
    const response = await api("/v1/audio/voice-conversion", { method: "POST", body: form });
    const blob = await response.blob();
    const rate = Number(response.headers.get("X-Sample-Rate"));
    const previous = $("convert-link").href;
    if (previous.startsWith("blob:")) URL.revokeObjectURL(previous);
    const url = URL.createObjectURL(blob);
    $("convert-link").href = url;
    $("convert-audio").src = url;
    $("convert-result").hidden = false;
    stats.convertedSeconds = rate ? (blob.size - 44) / 2 / rate : null;  // 16-bit mono WAV after its 44-byte header
    stats.conversions += 1;
    $("convert-message").textContent = stats.convertedSeconds === null ? "Done."
      : `Done: ${stats.convertedSeconds.toFixed(2)} s.`;
  } catch (error) {
    $("convert-message").textContent = "";
    showError(error);
  } finally {
    $("convert-run").disabled = false;
    render();
  }
}

function socketUrl(path) {
  const protocols = ["cadenza"];
  if (apiKey()) protocols.push(`cadenza.key.${base64url(apiKey())}`);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return [`${scheme}//${location.host}${path}`, protocols];
}

async function liveConvert() {
  if (live) return endLive(live);
  stop();
  clearError();
  const ctx = context();
  await ctx.resume();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  } catch (error) {
    showError(new ApiError(`cannot record: ${error.message}`, "audio"));
    return;
  }
  const { fields } = speechFields();
  const config = { type: "session.config", model: fields.model, sample_rate: ctx.sampleRate };
  if (fields.voice) config.voice = fields.voice;
  if (fields.seed !== undefined) config.seed = fields.seed;
  const socket = new WebSocket(...socketUrl(LIVE_PATH));
  socket.binaryType = "arraybuffer";
  const current = { socket, stream, source: null, processor: null, player: null, ending: false, done: false, failed: false };
  live = current;
  Object.assign(stats, { liveSentSeconds: 0, liveReceivedSeconds: 0 });
  $("live-run").textContent = "Stop";
  $("live-message").textContent = "Connecting…";
  socket.addEventListener("open", () => socket.send(JSON.stringify(config)));
  socket.addEventListener("message", (event) => {
    if (typeof event.data !== "string") {
      if (!current.player) return;  // audio comes after audio.start
      const bytes = new Uint8Array(event.data);
      current.player.push(bytes);
      stats.liveReceivedSeconds += bytes.length / 2 / current.player.sampleRate;
      render();
      return;
    }
    const message = JSON.parse(event.data);
    if (message.type === "audio.start") {
      current.player = startPlayer(message.sample_rate);
      // A ScriptProcessorNode hands over the microphone's samples on the main thread, which is all this needs (an
      // AudioWorklet would need a module of its own); its output stays silent.
      current.source = ctx.createMediaStreamSource(stream);
      current.processor = ctx.createScriptProcessor(LIVE_FRAME, 1, 1);
      current.processor.addEventListener("audioprocess", (e) => {
        if (current.ending || socket.readyState !== WebSocket.OPEN) return;
        const samples = e.inputBuffer.getChannelData(0);
        const pcm = new Int16Array(samples.length);
        for (let i = 0; i < samples.length; i++) pcm[i] = Math.max(-32768, Math.min(32767, Math.round(samples[i] * 32767)));
        socket.send(pcm.buffer);
        stats.liveSentSeconds += samples.length / ctx.sampleRate;
      });
      current.source.connect(current.processor);
      current.processor.connect(ctx.destination);
      $("live-message").textContent = "Listening… (Stop to finish)";
    } else if (message.type === "audio.done") {
      current.done = true;
      stats.liveConversions += 1;
      $("live-message").textContent = `Done: ${message.audio_seconds.toFixed(2)} s converted.`;
    } else if (message.type === "error") {
      current.failed = true;
      const { message: text, param } = message.error;
      showError(new ApiError(text, param));
    }
  });
  socket.addEventListener("close", (event) => {
    releaseMicrophone(current);
    if (live === current) live = null;
    $("live-run").textContent = "Convert as I speak";
    if (!current.done) $("live-message").textContent = "";
    if (!current.done && !current.failed) {
      showError(new ApiError(event.code === 1006 && !current.player
        ? "the server refused the connection (is the API key right?)"
        : `the connection closed before the conversion was done (code ${event.code})`));
    }
    render();
  });
}

function releaseMicrophone(current) {
  if (current.processor) current.processor.disconnect();
  if (current.source) current.source.disconnect();
  for (const track of current.stream.getTracks()) track.stop();
}

function endLive(current) {
  // No more microphone: the server converts what it has and ends with audio.done.
  current.ending = true;
  releaseMicrophone(current);
  if (current.socket.readyState === WebSocket.OPEN) current.socket.send(JSON.stringify({ type: "input.done" }));
  $("live-message").textContent = "Finishing…";
}

// ---- voices: upload, record, delete -------------------------------------------------------------------------------

async function record() {
  if (recorder) {
    recorder.stop();
    return;
  }
  clearError();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (error) {
    showError(new ApiError(`cannot record: ${error.message}`, "audio"));
    return;
  }
  const chunks = [];
  recorder = new MediaRecorder(stream);
  const limit = setTimeout(() => recorder && recorder.stop(), MAX_RECORD_S * 1000);
  recorder.addEventListener("dataavailable", (event) => chunks.push(event.data));
  recorder.addEventListener("stop", () => {
    clearTimeout(limit);
    for (const track of stream.getTracks()) track.stop();
    recorded = new Blob(chunks, { type: recorder.mimeType || "audio/webm" });
    recorder = null;
    $("voice-file").value = "";
    $("recorded").src = URL.createObjectURL(recorded);
    $("recorded").hidden = false;
    $("record").textContent = "Record again";
    $("record").classList.remove("recording");
  });
  recorder.start();
  $("record").textContent = "Stop recording";
  $("record").classList.add("recording");
}

function recordingName(blob) {
  const type = blob.type.split(";")[0];
  return `recording.${{ "audio/ogg": "ogg", "audio/mp4": "m4a", "audio/wav": "wav" }[type] || "webm"}`;
}

async function saveVoice(event) {
  event.preventDefault();
  clearError();
  $("voice-message").textContent = "";
  const file = $("voice-file").files[0];
  const audio = file || recorded;
  if (!audio) return showError(new ApiError("choose a recording, or record one", "audio"));
  if (!$("voice-consent").checked) {
    return showError(new ApiError("tick the box: the speaker must have agreed to have their voice cloned", "consent"));
  }
  const form = new FormData();
  form.append("audio", audio, file ? file.name : recordingName(audio));
  form.append("name", $("voice-name").value.trim());
  form.append("consent", $("voice-statement").value);
  form.append("model", selectedModel().id);
  const transcript = $("voice-transcript").value.trim();
  if (transcript) form.append("transcript", transcript);
  const declaredBy = $("voice-declared-by").value.trim();
  if (declaredBy) form.append("declared_by", declaredBy);
  if (!$("cloning-field").hidden) form.append("cloning", $("voice-cloning").value);
  $("save-voice").disabled = true;
  $("voice-message").textContent = "Saving…";
  try {
    const voice = await (await api("/v1/audio/voices", { method: "POST", body: form })).json();
    await loadVoices();
    fillVoiceSelect(voice.id);
    $("voice-form").reset();
    recorded = null;
    $("recorded").hidden = true;
    $("record").textContent = "Record";
    $("voice-message").textContent = `Saved "${voice.name}" (${voice.duration.toFixed(1)} s).`;
  } catch (error) {
    $("voice-message").textContent = "";
    showError(error);
  } finally {
    $("save-voice").disabled = false;
  }
}

async function deleteVoice(voice) {
  if (!confirm(`Delete the voice "${voice.name}" and its stored features?`)) return;
  clearError();
  try {
    await api(`/v1/audio/voices/${encodeURIComponent(voice.id)}`, { method: "DELETE" });
    await loadVoices();
    $("voice-message").textContent = `Deleted "${voice.name}".`;
  } catch (error) {
    showError(error);
  }
}

// ---- wiring -------------------------------------------------------------------------------------------------------

function init() {
  $("api-key").value = localStorage.getItem(KEY_STORAGE) || "";
  $("api-key").addEventListener("change", () => {
    const key = apiKey();
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
    refresh();
  });
  $("model").addEventListener("change", applyCapabilities);
  $("play").addEventListener("click", play);
  $("stop").addEventListener("click", stop);
  $("download").addEventListener("click", download);
  $("record").addEventListener("click", record);
  $("voice-file").addEventListener("change", () => {
    recorded = null;
    $("recorded").hidden = true;
  });
  $("voice-form").addEventListener("submit", saveVoice);
  $("convert-run").addEventListener("click", convert);
  $("live-run").addEventListener("click", liveConvert);
  if (!navigator.mediaDevices || !window.MediaRecorder) {
    for (const id of ["record", "live-run"]) {
      $(id).disabled = true;
      $(id).title = "recording needs a secure page (https, or localhost)";
    }
  }
  waveform.draw();
  refresh();
}

init();
