/* The pipeline page: settings -> POST /api/simulate -> the timeline player.
 * The settings live in the URL (same names as the API's fields), so a link reproduces the view. */
(function () {
  'use strict';
  const TL = window.ModelcutTimeline;
  const $ = (id) => document.getElementById(id);
  const DEFAULTS = {schedule: 'interleaved', devices: 4, microbatches: 8, chunks: 2,
                    forward: 1, backward: 2, weight: null, p2p: 0};
  const INTS = ['devices', 'microbatches', 'chunks'];
  let schedules = {};
  let inflight = null;
  let timer = 0;
  let seq = 0;
  let shown = null;

  const player = new TL.Player($('player'), {onPause: (t) => writeUrl(t)});

  function num(s) {
    if (s === null || s === undefined || String(s).trim() === '') return null;
    const x = Number(s);
    return Number.isFinite(x) ? x : NaN;
  }

  function readUrl() {
    const q = new URLSearchParams(location.search);
    const st = Object.assign({}, DEFAULTS);
    if (q.get('schedule')) st.schedule = q.get('schedule');
    for (const k of ['devices', 'microbatches', 'chunks', 'forward', 'backward', 'weight', 'p2p']) {
      if (q.has(k)) st[k] = num(q.get(k));
    }
    if (q.has('speed')) st.speed = num(q.get('speed'));
    if (q.has('t')) st.t = num(q.get('t'));
    return st;
  }

  function ratioText(st) {
    const parts = [st.forward, st.backward];
    if (st.weight !== null && st.weight !== undefined) parts.push(st.weight);
    return parts.map((x) => TL.fmt(x, 6)).join(':');
  }

  function setForm(st) {
    const sel = $('schedule');
    if (!schedules[st.schedule]) {
      const o = document.createElement('option');
      o.value = o.textContent = st.schedule;
      sel.append(o);
    }
    sel.value = st.schedule;
    $('devices').value = st.devices ?? '';
    $('microbatches').value = st.microbatches ?? '';
    $('chunks').value = st.chunks ?? '';
    $('p2p').value = st.p2p ?? 0;
    $('ratio').value = ratioText(st);
    syncChunks(false);
  }

  /** Schedules that run one chunk count only: show it, greyed out. */
  function syncChunks(reset) {
    const info = schedules[$('schedule').value];
    const ch = $('chunks');
    $('schedule-doc').textContent = info ? info.doc : '';
    if (!info) { ch.disabled = false; return; }
    if (info.chunks_fixed) {
      ch.value = info.default_chunks;
      ch.disabled = true;
      ch.title = `${info.name} runs ${info.default_chunks} chunk${info.default_chunks === 1 ? '' : 's'} per device`;
    } else {
      if (ch.disabled || reset) ch.value = info.default_chunks;
      ch.disabled = false;
      ch.title = '';
    }
  }

  function parseRatio(text) {
    const parts = text.split(':').map((s) => s.trim());
    if (parts.length < 2 || parts.length > 3 || parts.some((s) => s === '')) {
      return {error: 'time ratio: write F:B or F:B:W, e.g. 1:2 or 1:1:1'};
    }
    const xs = parts.map(Number);
    if (xs.some((x) => !Number.isFinite(x) || x < 0)) {
      return {error: 'time ratio: each part must be a number of zero or more'};
    }
    return {forward: xs[0], backward: xs[1], weight: xs.length === 3 ? xs[2] : null};
  }

  /** The form as an API body, or the first problem found. */
  function readForm() {
    const body = {schedule: $('schedule').value};
    const problems = [];
    for (const id of ['devices', 'microbatches', 'p2p', 'ratio', 'chunks']) $(id).removeAttribute('aria-invalid');
    for (const k of INTS) {
      if (k === 'chunks' && $('chunks').disabled) continue;
      const x = num($(k).value);
      if (x === null || !Number.isInteger(x) || x < 1) {
        problems.push(`${$(k).labels[0].textContent}: a whole number of 1 or more`);
        $(k).setAttribute('aria-invalid', 'true');
      } else body[k] = x;
    }
    if ($('chunks').disabled) body.chunks = null;
    const r = parseRatio($('ratio').value);
    if (r.error) { problems.push(r.error); $('ratio').setAttribute('aria-invalid', 'true'); }
    else Object.assign(body, r);
    const p2p = num($('p2p').value);
    if (p2p === null || Number.isNaN(p2p) || p2p < 0) {
      problems.push('Send time: a number of zero or more');
      $('p2p').setAttribute('aria-invalid', 'true');
    } else body.p2p = p2p;
    return {body, problems};
  }

  function writeUrl(t) {
    const {body, problems} = readForm();
    if (problems.length) return;
    const q = new URLSearchParams();
    q.set('schedule', body.schedule);
    q.set('devices', body.devices);
    q.set('microbatches', body.microbatches);
    if (body.chunks !== null && body.chunks !== undefined) q.set('chunks', body.chunks);
    q.set('forward', body.forward);
    q.set('backward', body.backward);
    if (body.weight !== null) q.set('weight', body.weight);
    q.set('p2p', body.p2p);
    if (player.speed !== 1) q.set('speed', player.speed);
    const T = shown ? shown.makespan : 0;
    if (t !== undefined && t !== null && !player.playing && t < T) q.set('t', +t.toFixed(6));
    const url = location.pathname + '?' + q.toString();
    if (url !== location.pathname + location.search) history.replaceState(null, '', url);
  }

  function showError(msg) { $('error').textContent = msg || ''; }

  /** A refused simulation: the title names what was asked, not the last answer; the stale
   *  timeline and figures go until the next answer. */
  function refused(body) {
    const v = body.chunks === null || body.chunks === undefined ? '' : ` · v = ${body.chunks}`;
    $('title').textContent = `${body.schedule} · p = ${body.devices} devices · m = ${body.microbatches}${v}: not simulated`;
    document.title = `modelcut · ${body.schedule} p=${body.devices} m=${body.microbatches}: not simulated`;
    $('stats').textContent = '';
    $('stats').hidden = true;
    $('player').hidden = true;
    player.pause && player.pause();
    shown = null;
  }

  async function simulate(opts) {
    const {body, problems} = readForm();
    if (problems.length) { showError(problems.join('; ')); return; }
    showError('');
    writeUrl();
    if (inflight) inflight.abort();
    const ctrl = new AbortController();
    inflight = ctrl;
    const mine = ++seq;
    $('player').classList.add('busy');
    try {
      const res = await fetch('/api/simulate', {
        method: 'POST', headers: {'Content-Type': 'application/json'},
        body: JSON.stringify(body), signal: ctrl.signal});
      const data = await res.json().catch(() => ({detail: `the server answered ${res.status}`}));
      if (mine !== seq) return;
      if (!res.ok) {
        showError(typeof data.detail === 'string' ? data.detail : `error ${res.status}`);
        refused(body);
        return;
      }
      $('player').hidden = false;
      $('stats').hidden = false;
      shown = data;
      $('title').textContent = TL.title(data);
      document.title = `modelcut · ${data.schedule} p=${data.devices} m=${data.microbatches} v=${data.chunks}`;
      TL.renderStats($('stats'), data);
      player.setData(data, opts && opts.time !== undefined && opts.time !== null ? {time: opts.time} : undefined);
    } catch (e) {
      if (e.name !== 'AbortError') showError(`could not reach the server: ${e.message}`);
    } finally {
      if (mine === seq) { $('player').classList.remove('busy'); inflight = null; }
    }
  }

  function soon() {
    clearTimeout(timer);
    timer = setTimeout(simulate, 120);
  }

  async function start() {
    const st = readUrl();
    try {
      const res = await fetch('/api/catalog');
      const cat = await res.json();
      for (const s of cat.schedules) schedules[s.name] = s;
      const sel = $('schedule');
      sel.textContent = '';
      for (const s of cat.schedules) {
        const o = document.createElement('option');
        o.value = s.name;
        o.textContent = s.name;
        o.title = s.doc;
        sel.append(o);
      }
    } catch (e) {
      showError(`could not load the schedules: ${e.message}`);
    }
    if (st.chunks === null || st.chunks === undefined) {
      const info = schedules[st.schedule];
      st.chunks = info ? info.default_chunks : 1;
    }
    setForm(st);
    if (st.speed && [0.25, 0.5, 1, 2, 4, 8].includes(st.speed)) {
      player.speed = st.speed;
      player.speedSel.value = String(st.speed);
    }
    player.speedSel.addEventListener('change', () => writeUrl());
    $('schedule').addEventListener('change', () => { syncChunks(true); soon(); });
    const form = $('settings');
    form.addEventListener('input', (e) => { if (e.target.id !== 'schedule') soon(); });
    form.addEventListener('submit', (e) => { e.preventDefault(); simulate(); });
    const reduced = window.matchMedia && window.matchMedia('(prefers-reduced-motion: reduce)').matches;
    if (reduced && (st.t === undefined || st.t === null)) player.opts.autoplay = false;
    await simulate({time: st.t});
  }

  start();
})();
