/* modelcut timeline player: the animated pipeline timeline and per-device activation memory.
 *
 * Shared by the pipeline page (served by `modelcut serve`) and the offline export
 * (`modelcut simulate --html FILE`, which inlines this file). It draws the object of
 * `modelcut simulate --json` / `POST /api/simulate`; it computes nothing the simulator
 * has not already computed, only positions on the screen.
 *
 *   const player = new ModelcutTimeline.Player(element, {onPause: fn});
 *   player.setData(result);            // ops, makespan, memory_timeline, ...
 *   ModelcutTimeline.renderStats(el, result);
 */
(function (root) {
  'use strict';

  // Micro-batch colours: Tableau 10 without its grey (grey means idle here).
  const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f',
                   '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#17becf'];
  const FONT = 'system-ui, -apple-system, "Segoe UI", "Liberation Sans", "DejaVu Sans", Arial, sans-serif';
  const KIND_NAME = {F: 'forward', B: 'backward', W: 'weight gradient'};
  const INK = '#1f2430';
  const MUTED = '#5b6170';
  const GRID = '#d9dce3';
  const MEM_FILL = '#4a5a7a';
  const SPEEDS = [0.25, 0.5, 1, 2, 4, 8];

  function clamp(x, lo, hi) { return Math.max(lo, Math.min(hi, x)); }

  function hexRgb(hex) {
    const n = parseInt(hex.slice(1), 16);
    return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
  }
  function rgbHex(c) {
    return '#' + c.map(v => clamp(Math.round(v), 0, 255).toString(16).padStart(2, '0')).join('');
  }
  function mix(hex, other, f) {
    const a = hexRgb(hex), b = hexRgb(other);
    return rgbHex(a.map((v, i) => v + (b[i] - v) * f));
  }
  function luminance(hex) {
    const [r, g, b] = hexRgb(hex);
    return (0.299 * r + 0.587 * g + 0.114 * b) / 255;
  }

  /** Colour of an op: F the micro-batch's colour, B darker, W lighter (and striped). */
  function opFill(kind, mb) {
    const base = PALETTE[mb % PALETTE.length];
    if (kind === 'B') return mix(base, '#000000', 0.38);
    if (kind === 'W') return mix(base, '#ffffff', 0.55);
    return base;
  }

  /** A number for people: integers as they are, others to at most 4 decimals. */
  function fmt(x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return '—';
    const d = digits === undefined ? 4 : digits;
    if (Number.isInteger(x)) return x.toLocaleString('en-US');
    const s = x.toFixed(d).replace(/0+$/, '').replace(/\.$/, '');
    return s === '-0' ? '0' : s;
  }

  /** Round tick step: 1, 2 or 5 times a power of ten, about `target` ticks over `span`. */
  function tickStep(span, target) {
    if (!(span > 0)) return 1;
    const raw = span / Math.max(1, target);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const r = raw / p;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * p;
  }

  function chunkMark(chunk) {
    if (!chunk) return '';
    return chunk <= 3 ? '\u2032'.repeat(chunk) : '.' + chunk;
  }

  function hatch(ctx, scale) {
    const c = document.createElement('canvas');
    const s = Math.max(6, Math.round(8 * scale));
    c.width = c.height = s;
    const g = c.getContext('2d');
    g.fillStyle = '#eceef2';
    g.fillRect(0, 0, s, s);
    g.strokeStyle = '#b4b9c4';
    g.lineWidth = Math.max(1, scale);
    g.beginPath();
    g.moveTo(0, s); g.lineTo(s, 0);
    g.moveTo(-s / 2, s / 2); g.lineTo(s / 2, -s / 2);
    g.moveTo(s / 2, s * 1.5); g.lineTo(s * 1.5, s / 2);
    g.stroke();
    return ctx.createPattern(c, 'repeat');
  }

  function stripes(ctx, colour, scale) {
    const c = document.createElement('canvas');
    const s = Math.max(4, Math.round(6 * scale));
    c.width = c.height = s;
    const g = c.getContext('2d');
    g.fillStyle = mix(colour, '#ffffff', 0.55);
    g.fillRect(0, 0, s, s);
    g.strokeStyle = colour;
    g.lineWidth = Math.max(1, 1.5 * scale);
    g.beginPath();
    g.moveTo(0, s); g.lineTo(s, 0);
    g.moveTo(-s / 2, s / 2); g.lineTo(s / 2, -s / 2);
    g.moveTo(s / 2, s * 1.5); g.lineTo(s * 1.5, s / 2);
    g.stroke();
    return ctx.createPattern(c, 'repeat');
  }

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children || []) e.append(c);
    return e;
  }

  function sizeCanvas(canvas, w, h) {
    const dpr = root.devicePixelRatio || 1;
    canvas.style.width = w + 'px';
    canvas.style.height = h + 'px';
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  /** Ops that run at the same time on one device (an overlapped unit, DualPipe's F&B) share
   *  their lane: each gets a row (`_slot`) of `_k` rows. Returns whether any lane has such ops. */
  function stackOverlaps(lanes, eps) {
    let any = false;
    for (const lane of lanes) {
      let i = 0;
      while (i < lane.length) {
        const ends = [];
        let j = i, end = lane[i].end;
        while (j < lane.length && (j === i || lane[j].start < end - eps)) {
          const op = lane[j];
          let slot = ends.findIndex((e) => e <= op.start + eps);
          if (slot < 0) { slot = ends.length; ends.push(op.end); } else ends[slot] = op.end;
          op._slot = slot;
          end = Math.max(end, op.end);
          j++;
        }
        for (let q = i; q < j; q++) lane[q]._k = ends.length;
        if (ends.length > 1) any = true;
        i = j;
      }
    }
    return any;
  }

  class Player {
    constructor(container, options) {
      this.opts = Object.assign({seconds: 12, autoplay: true, onPause: null}, options || {});
      this.container = container;
      this.data = null;
      this.t = 0;
      this.playing = false;
      this.speed = 1;
      this._raf = 0;
      this._build();
    }

    _build() {
      const c = this.container;
      c.classList.add('mc-player');
      c.tabIndex = 0;
      this.btnRestart = el('button', {type: 'button', class: 'mc-btn', title: 'Back to the start (Home)',
                                      'aria-label': 'Back to the start', text: '\u00AB Start'});
      this.btnBack = el('button', {type: 'button', class: 'mc-btn', title: 'Previous event (\u2190)',
                                   'aria-label': 'Previous event', text: '\u2039 Step'});
      this.btnPlay = el('button', {type: 'button', class: 'mc-btn mc-play', title: 'Play or pause (space)',
                                   'data-testid': 'play', text: '\u25B6 Play'});
      this.btnStep = el('button', {type: 'button', class: 'mc-btn', title: 'Next event (\u2192)',
                                   'aria-label': 'Next event', text: 'Step \u203A'});
      this.speedSel = el('select', {class: 'mc-speed', 'aria-label': 'Playback speed', title: 'Playback speed'});
      for (const s of SPEEDS) {
        const o = el('option', {value: String(s), text: s + '\u00D7'});
        if (s === 1) o.selected = true;
        this.speedSel.append(o);
      }
      this.scrub = el('input', {type: 'range', class: 'mc-scrub', min: '0', max: '1000', step: '1', value: '0',
                                'aria-label': 'Simulated time'});
      this.timeOut = el('output', {class: 'mc-time', 'data-testid': 'time', 'aria-live': 'off'});
      const controls = el('div', {class: 'mc-controls'}, [
        this.btnRestart, this.btnBack, this.btnPlay, this.btnStep,
        el('label', {class: 'mc-speed-label'}, ['Speed ', this.speedSel]), this.scrub, this.timeOut]);
      this.canvas = el('canvas', {class: 'mc-timeline', role: 'img', 'data-testid': 'timeline'});
      this.tip = el('div', {class: 'mc-tip', role: 'tooltip'});
      this.tip.hidden = true;
      this.wrap = el('div', {class: 'mc-canvas-wrap'}, [this.canvas, this.tip]);
      this.legend = el('div', {class: 'mc-legend', 'data-testid': 'legend'});
      this.memHead = el('h3', {class: 'mc-subhead'});
      this.memCanvas = el('canvas', {class: 'mc-memory', role: 'img', 'data-testid': 'memory'});
      this.memWrap = el('div', {class: 'mc-canvas-wrap'}, [this.memCanvas]);
      c.append(controls, this.wrap, this.legend, this.memHead, this.memWrap);

      this.btnPlay.addEventListener('click', () => this.toggle());
      this.btnStep.addEventListener('click', () => this.step(1));
      this.btnBack.addEventListener('click', () => this.step(-1));
      this.btnRestart.addEventListener('click', () => { this.pause(); this.setTime(0); });
      this.speedSel.addEventListener('change', () => { this.speed = Number(this.speedSel.value) || 1; });
      this.scrub.addEventListener('input', () => {
        this.pause(true);
        if (this.data) this.setTime(Number(this.scrub.value) / 1000 * this.data.makespan);
      });
      this.scrub.addEventListener('change', () => this._paused());
      c.addEventListener('keydown', (e) => {
        if (e.target.tagName === 'SELECT' || e.target.tagName === 'INPUT') return;
        if (e.key === ' ') { this.toggle(); e.preventDefault(); }
        else if (e.key === 'ArrowRight') { this.step(1); e.preventDefault(); }
        else if (e.key === 'ArrowLeft') { this.step(-1); e.preventDefault(); }
        else if (e.key === 'Home') { this.pause(); this.setTime(0); e.preventDefault(); }
        else if (e.key === 'End' && this.data) { this.pause(); this.setTime(this.data.makespan); e.preventDefault(); }
      });
      let dragging = false;
      const scrubAt = (e, cv, geo) => {
        if (!this.data || !geo) return;
        const r = cv.getBoundingClientRect();
        const x = e.clientX - r.left;
        this.setTime(clamp((x - geo.left) / geo.plotW, 0, 1) * this.data.makespan);
      };
      for (const [cv, key] of [[this.canvas, 'geo'], [this.memCanvas, 'memGeo']]) {
        cv.addEventListener('pointerdown', (e) => {
          dragging = true; this.pause(true); scrubAt(e, cv, this[key]);
          if (cv.setPointerCapture) cv.setPointerCapture(e.pointerId);
        });
        cv.addEventListener('pointermove', (e) => { if (dragging) scrubAt(e, cv, this[key]); });
        cv.addEventListener('pointerup', () => { if (dragging) { dragging = false; this._paused(); } });
      }
      this.canvas.addEventListener('mousemove', (e) => this._hover(e));
      this.canvas.addEventListener('mouseleave', () => { this.tip.hidden = true; });
      if (root.ResizeObserver) {
        let last = 0;
        new ResizeObserver(() => {
          const w = this.wrap.clientWidth;
          if (w && w !== last) { last = w; this._layout(); }
        }).observe(this.wrap);
      }
    }

    /** Show a new simulation. Keeps the relative position of the cursor unless told where. */
    setData(data, opts) {
      const o = opts || {};
      const prev = this.data;
      const prevFrac = prev && prev.makespan > 0 ? this.t / prev.makespan : 1;
      this.data = data;
      // Ops per device in time order (the simulator lists them in each device's order).
      const lanes = Array.from({length: data.devices}, () => []);
      for (const op of data.ops) lanes[op.device].push(op);
      for (const l of lanes) l.sort((a, b) => a.start - b.start);
      this.lanes = lanes;
      this.overlapped = stackOverlaps(lanes, 1e-12 * Math.max(1, data.makespan));
      const ev = new Float64Array(data.ops.length * 2 + 2);
      let k = 0;
      ev[k++] = 0; ev[k++] = data.makespan;
      for (const op of data.ops) { ev[k++] = op.start; ev[k++] = op.end; }
      ev.sort();
      const uniq = [];
      for (const x of ev) if (!uniq.length || x - uniq[uniq.length - 1] > 1e-12 * Math.max(1, data.makespan)) uniq.push(x);
      this.events = uniq;
      this.peak = data.peak_activations.reduce((a, b) => Math.max(a, b), 0);
      this.canvas.setAttribute('aria-label',
        `Pipeline timeline: ${data.schedule}, ${data.devices} devices, ${data.microbatches} micro-batches, ` +
        `${data.chunks} chunks per device; makespan ${fmt(data.makespan)}, bubble ${fmt(data.bubble)}`);
      this.memCanvas.setAttribute('aria-label', 'Activation memory of each device over simulated time');
      this._legend();
      this._layout();
      let t;
      if (o.time !== undefined && o.time !== null) t = o.time;
      else if (!prev) t = this.opts.autoplay ? 0 : data.makespan;
      else t = prevFrac * data.makespan;
      this.setTime(clamp(t, 0, data.makespan));
      if (!prev && this.opts.autoplay && o.time === undefined) this.play();
    }

    _legend() {
      const d = this.data;
      const L = this.legend;
      L.textContent = '';
      const kinds = el('div', {class: 'mc-legend-group'});
      kinds.append(el('span', {class: 'mc-legend-title', text: 'Ops'}));
      const demo = PALETTE[0];
      const kindList = d.timing && d.timing.split_backward ? ['F', 'B', 'W'] : ['F', 'B'];
      for (const k of kindList) {
        const sw = el('span', {class: 'mc-swatch mc-kind-' + k});
        sw.style.background = k === 'W'
          ? `repeating-linear-gradient(135deg, ${demo} 0 2px, ${mix(demo, '#ffffff', 0.55)} 2px 5px)`
          : opFill(k, 0);
        kinds.append(el('span', {class: 'mc-legend-item'}, [sw, `${k} ${KIND_NAME[k]}`]));
      }
      const idle = el('span', {class: 'mc-swatch mc-idle'});
      kinds.append(el('span', {class: 'mc-legend-item'}, [idle, 'idle (the bubble)']));
      if (d.chunks > 1) kinds.append(el('span', {class: 'mc-legend-note', text: `\u2032 marks chunk 1, \u2033 chunk 2, \u2034 chunk 3, .k chunk k`}));
      if (this.overlapped) kinds.append(el('span', {class: 'mc-legend-note', text: 'ops stacked in one lane run overlapped, as one unit'}));
      const mbs = el('div', {class: 'mc-legend-group'});
      mbs.append(el('span', {class: 'mc-legend-title', text: 'Micro-batch'}));
      const n = Math.min(d.microbatches, PALETTE.length);
      for (let i = 0; i < n; i++) {
        const sw = el('span', {class: 'mc-swatch'});
        sw.style.background = PALETTE[i];
        mbs.append(el('span', {class: 'mc-legend-item'}, [sw, String(i)]));
      }
      if (d.microbatches > PALETTE.length) {
        mbs.append(el('span', {class: 'mc-legend-note', text: `colours repeat every ${PALETTE.length}`}));
      }
      L.append(kinds, mbs);
      this.memHead.textContent = '';
      this.memHead.append('Activation memory per device ',
        el('small', {text: `(in micro-batches' activations; full row = ${fmt(this.peak)})`}));
    }

    _layout() {
      if (!this.data) return;
      const d = this.data;
      const W = Math.max(320, this.wrap.clientWidth || 800);
      const p = d.devices;
      // Canvas text follows the page's type size (larger on projectors, see style.css).
      const k = (parseFloat(root.getComputedStyle(this.container).fontSize) || 16) / 16;
      this.k = k;
      const laneH = clamp(Math.floor(440 * k / p), 14, Math.round(40 * k));
      const gap = laneH >= 24 ? 6 : laneH >= 18 ? 4 : 2;
      const small = laneH < 20;
      const geo = {
        W, p, laneH, gap, small,
        left: Math.round((small ? 64 : 88) * k), right: Math.round(112 * k), top: 6, axisH: Math.round(40 * k),
      };
      geo.plotW = W - geo.left - geo.right;
      geo.H = geo.top + p * (laneH + gap) - gap + geo.axisH;
      this.geo = geo;
      this.ctx = sizeCanvas(this.canvas, W, geo.H);
      const dpr = root.devicePixelRatio || 1;
      this.idlePattern = hatch(this.ctx, 1);
      // The ops drawn once, off screen; each frame reveals them up to the cursor.
      const off = document.createElement('canvas');
      off.width = Math.round(W * dpr);
      off.height = Math.round(geo.H * dpr);
      const g = off.getContext('2d');
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      this._drawOps(g);
      this.off = off;
      // Memory rows.
      const rowH = clamp(Math.floor(240 * k / p), 14, Math.round(34 * k));
      const mgap = rowH >= 20 ? 6 : 3;
      const mg = {W, p, rowH, gap: mgap, left: geo.left, right: geo.right, top: 4, bottom: 4, small: rowH < 20};
      mg.plotW = W - mg.left - mg.right;
      mg.H = mg.top + p * (rowH + mgap) - mgap + mg.bottom;
      this.memGeo = mg;
      this.memCtx = sizeCanvas(this.memCanvas, W, mg.H);
      const moff = document.createElement('canvas');
      moff.width = Math.round(W * dpr);
      moff.height = Math.round(mg.H * dpr);
      const mctx = moff.getContext('2d');
      mctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      this._drawMemory(mctx);
      this.memOff = moff;
      this.draw();
    }

    _x(t) { const g = this.geo; return g.left + (this.data.makespan > 0 ? t / this.data.makespan : 0) * g.plotW; }
    _laneY(dev) { const g = this.geo; return g.top + dev * (g.laneH + g.gap); }

    _drawOps(g) {
      const d = this.data, geo = this.geo;
      const fontPx = clamp(geo.laneH - 10, 9, Math.round(13 * this.k));
      g.font = `600 ${fontPx}px ${FONT}`;
      g.textAlign = 'center';
      g.textBaseline = 'middle';
      const stripeCache = new Map();
      const minW = g.measureText('8').width + 4;
      for (const op of d.ops) {
        const x0 = this._x(op.start), x1 = this._x(op.end);
        const k = op._k || 1;
        const hgt = geo.laneH / k;
        const y = this._laneY(op.device) + (op._slot || 0) * hgt;
        const w = Math.max(x1 - x0, 0.6);
        const fill = opFill(op.kind, op.microbatch);
        if (op.kind === 'W') {
          const base = PALETTE[op.microbatch % PALETTE.length];
          if (!stripeCache.has(base)) stripeCache.set(base, stripes(g, base, 1));
          g.fillStyle = stripeCache.get(base);
        } else {
          g.fillStyle = fill;
        }
        g.fillRect(x0, y, w, hgt);
        if (w >= 3) {
          g.strokeStyle = 'rgba(255,255,255,0.9)';
          g.lineWidth = 1;
          g.strokeRect(x0 + 0.5, y + 0.5, w - 1, hgt - 1);
        }
        if (w < minW || hgt < 14) continue;
        if (k > 1) g.font = `600 ${clamp(Math.floor(hgt) - 4, 9, fontPx)}px ${FONT}`;
        // The longest label that fits: kind, micro-batch and chunk marks; else the micro-batch alone.
        const mark = chunkMark(op.chunk);
        for (const label of [op.kind + op.microbatch + mark, op.microbatch + mark, String(op.microbatch)]) {
          if (g.measureText(label).width + 4 <= w) {
            g.fillStyle = op.kind === 'W' ? INK : (luminance(fill) > 0.6 ? INK : '#ffffff');
            g.fillText(label, x0 + w / 2, y + hgt / 2 + 0.5);
            break;
          }
        }
        if (k > 1) g.font = `600 ${fontPx}px ${FONT}`;
      }
    }

    _drawMemory(g) {
      const d = this.data, mg = this.memGeo;
      const T = d.makespan;
      const sx = (t) => mg.left + (T > 0 ? t / T : 0) * mg.plotW;
      const peak = this.peak > 0 ? this.peak : 1;
      g.fillStyle = MEM_FILL;
      for (let dev = 0; dev < mg.p; dev++) {
        const line = d.memory_timeline[dev] || [[0, 0]];
        const y0 = mg.top + dev * (mg.rowH + mg.gap);
        const base = y0 + mg.rowH;
        const sy = (v) => base - v / peak * mg.rowH;
        g.beginPath();
        g.moveTo(sx(0), base);
        let prev = 0;
        for (const [t, v] of line) {
          g.lineTo(sx(t), sy(prev));
          g.lineTo(sx(t), sy(v));
          prev = v;
        }
        g.lineTo(sx(T), sy(prev));
        g.lineTo(sx(T), base);
        g.closePath();
        g.fill();
      }
    }

    /** Activations on `dev` at time t (the value after the last change at or before t). */
    memoryAt(dev, t) {
      const line = this.data.memory_timeline[dev] || [];
      let lo = 0, hi = line.length - 1, ans = 0;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1;
        if (line[mid][0] <= t) { ans = line[mid][1]; lo = mid + 1; } else hi = mid - 1;
      }
      return ans;
    }

    draw() {
      if (!this.data || !this.ctx) return;
      const d = this.data, g = this.geo, ctx = this.ctx;
      const T = d.makespan;
      const xt = this._x(this.t);
      const px = (n) => Math.round(n * this.k);
      ctx.clearRect(0, 0, g.W, g.H);
      ctx.textBaseline = 'middle';
      for (let dev = 0; dev < g.p; dev++) {
        const y = this._laneY(dev);
        ctx.fillStyle = '#ffffff';
        ctx.fillRect(g.left, y, g.plotW, g.laneH);
        ctx.fillStyle = this.idlePattern;
        ctx.fillRect(g.left, y, xt - g.left, g.laneH);
        ctx.strokeStyle = GRID;
        ctx.lineWidth = 1;
        ctx.strokeRect(g.left + 0.5, y + 0.5, g.plotW - 1, g.laneH - 1);
        const b = d.bubble_per_device ? d.bubble_per_device[dev] : null;
        this._laneLabels(ctx, g, dev, y, g.laneH, `bubble ${fmt(b, 3)}`);
      }
      this._reveal(ctx, this.off, xt, g.left + g.plotW, g.H);
      // Time axis.
      const axisY = g.top + g.p * (g.laneH + g.gap) - g.gap + 4;
      ctx.strokeStyle = MUTED;
      ctx.beginPath(); ctx.moveTo(g.left, axisY + 0.5); ctx.lineTo(g.left + g.plotW, axisY + 0.5); ctx.stroke();
      ctx.fillStyle = MUTED;
      ctx.font = `${px(12)}px ${FONT}`;
      ctx.textAlign = 'center';
      ctx.textBaseline = 'top';
      const step = tickStep(T, Math.max(2, Math.floor(g.plotW / (80 * this.k))));
      for (let v = 0; v <= T + step * 1e-9; v += step) {
        const x = Math.round(this._x(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(x, axisY); ctx.lineTo(x, axisY + 4); ctx.stroke();
        ctx.fillText(fmt(v, 3), x, axisY + 6);
      }
      ctx.textAlign = 'left';
      ctx.fillText('time \u2192', g.left + g.plotW + 8, axisY + 6);
      ctx.textBaseline = 'middle';
      // Cursor.
      if (this.t > 0 && this.t < T) {
        ctx.strokeStyle = INK;
        ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(xt, 0); ctx.lineTo(xt, axisY); ctx.stroke();
        ctx.lineWidth = 1;
      }
      this._drawMemoryFrame();
      this.scrub.value = String(T > 0 ? Math.round(this.t / T * 1000) : 1000);
      this.timeOut.textContent = `t = ${fmt(this.t, 2)} of ${fmt(T, 3)}`;
      this.timeOut.dataset.t = String(this.t);
      this.container.dataset.t = String(this.t);
      this.container.dataset.playing = String(this.playing);
    }

    /** A lane's labels: the device's name left of the plot, `note` (muted) right of it; `geo`
     *  the panel's geometry (left, plotW, small), the lane from y, h high. */
    _laneLabels(ctx, geo, dev, y, h, note) {
      const px = (n) => Math.round(n * this.k);
      ctx.textBaseline = 'middle';
      ctx.fillStyle = INK;
      ctx.textAlign = 'right';
      ctx.font = `${px(geo.small ? 12 : 14)}px ${FONT}`;
      ctx.fillText(geo.small ? `d${dev}` : `Device ${dev}`, geo.left - 8, y + h / 2);
      ctx.textAlign = 'left';
      ctx.fillStyle = MUTED;
      ctx.font = `${px(geo.small ? 12 : 13)}px ${FONT}`;
      ctx.fillText(note, geo.left + geo.plotW + 8, y + h / 2);
    }

    /** Copy the offscreen picture `off` onto `ctx`: up to x = xt (the time now) in full colour,
     *  from there to x = right faintly, as a preview of the rest of the step. */
    _reveal(ctx, off, xt, right, H) {
      const dpr = root.devicePixelRatio || 1;
      const part = (x0, x1, alpha) => {
        ctx.save();
        ctx.beginPath(); ctx.rect(x0, 0, x1 - x0, H); ctx.clip();
        ctx.globalAlpha = alpha;
        ctx.drawImage(off, 0, 0, off.width / dpr, off.height / dpr);
        ctx.restore();
      };
      part(0, xt, 1);
      if (this.t < this.data.makespan) part(xt, right, 0.16);
    }

    _drawMemoryFrame() {
      const d = this.data, mg = this.memGeo, ctx = this.memCtx;
      const T = d.makespan;
      const xt = mg.left + (T > 0 ? this.t / T : 0) * mg.plotW;
      ctx.clearRect(0, 0, mg.W, mg.H);
      for (let dev = 0; dev < mg.p; dev++) {
        const y = mg.top + dev * (mg.rowH + mg.gap);
        ctx.fillStyle = '#f6f7f9';
        ctx.fillRect(mg.left, y, mg.plotW, mg.rowH);
        this._laneLabels(ctx, mg, dev, y, mg.rowH,
                         `${fmt(this.memoryAt(dev, this.t), 2)} (peak ${fmt(d.peak_activations[dev], 2)})`);
      }
      this._reveal(ctx, this.memOff, xt, mg.left + mg.plotW, mg.H);
      if (this.t > 0 && this.t < T) {
        ctx.strokeStyle = INK;
        ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(xt, 0); ctx.lineTo(xt, mg.H); ctx.stroke();
        ctx.lineWidth = 1;
      }
    }

    _hover(e) {
      if (!this.data || !this.geo) return;
      const g = this.geo;
      const r = this.canvas.getBoundingClientRect();
      const x = e.clientX - r.left, y = e.clientY - r.top;
      const dev = Math.floor((y - g.top) / (g.laneH + g.gap));
      const inLane = dev >= 0 && dev < g.p && (y - this._laneY(dev)) <= g.laneH;
      if (!inLane || x < g.left || x > g.left + g.plotW) { this.tip.hidden = true; return; }
      const t = (x - g.left) / g.plotW * this.data.makespan;
      const lane = this.lanes[dev];
      let lo = 0, hi = lane.length - 1, hit = null;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1;
        if (lane[mid].end < t) lo = mid + 1;
        else if (lane[mid].start > t) hi = mid - 1;
        else { hit = lane[mid]; lo = mid; break; }
      }
      if (hit && (hit._k || 1) > 1) {  // overlapped ops: the one in the pointer's row
        const slot = Math.floor((y - this._laneY(dev)) / (g.laneH / hit._k));
        for (let i = Math.max(0, lo - hit._k); i < Math.min(lane.length, lo + hit._k + 1); i++) {
          const o = lane[i];
          if (o.start <= t && t <= o.end && o._slot === slot) { hit = o; break; }
        }
      }
      this.tip.textContent = '';
      if (hit) {
        this.tip.append(el('strong', {text: `Device ${dev}: ${KIND_NAME[hit.kind]} of micro-batch ${hit.microbatch}`}),
          el('br'), `chunk ${hit.chunk} (stage ${hit.stage}), ${fmt(hit.start, 3)} \u2192 ${fmt(hit.end, 3)}`);
      } else {
        this.tip.append(el('strong', {text: `Device ${dev}: idle`}), el('br'), `at t = ${fmt(t, 3)}`);
      }
      this.tip.hidden = false;
      const tw = this.tip.offsetWidth;
      this.tip.style.left = clamp(x + 12, 0, g.W - tw - 4) + 'px';
      this.tip.style.top = (this._laneY(dev) + g.laneH + 6) + 'px';
    }

    setTime(t) {
      if (!this.data) return;
      this.t = clamp(t, 0, this.data.makespan);
      this.draw();
    }

    play() {
      if (!this.data || this.playing) return;
      if (this.t >= this.data.makespan) this.t = 0;
      this.playing = true;
      this.btnPlay.textContent = '\u275A\u275A Pause';
      let last = performance.now();
      const tick = (now) => {
        if (!this.playing) return;
        const dt = Math.min(0.1, (now - last) / 1000);
        last = now;
        const T = this.data.makespan;
        const next = this.t + dt * this.speed * T / this.opts.seconds;
        if (next >= T) { this.setTime(T); this.pause(); return; }
        this.setTime(next);
        this._raf = requestAnimationFrame(tick);
      };
      this._raf = requestAnimationFrame(tick);
      this.draw();
    }

    pause(quiet) {
      const was = this.playing;
      this.playing = false;
      cancelAnimationFrame(this._raf);
      this.btnPlay.textContent = '\u25B6 Play';
      this.container.dataset.playing = 'false';
      if (was && !quiet) this._paused();
    }

    _paused() { if (this.opts.onPause) this.opts.onPause(this.t); }

    toggle() { if (this.playing) this.pause(); else this.play(); }

    /** Jump to the next (dir > 0) or previous op start or end. */
    step(dir) {
      if (!this.data) return;
      this.pause(true);
      const ev = this.events, t = this.t, eps = 1e-9 * Math.max(1, this.data.makespan);
      let lo = 0, hi = ev.length;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (ev[mid] <= t + eps) lo = mid + 1; else hi = mid; }
      if (dir > 0) this.setTime(lo < ev.length ? ev[lo] : this.data.makespan);
      else {
        let i = lo - 1;
        while (i >= 0 && ev[i] >= t - eps) i--;
        this.setTime(i >= 0 ? ev[i] : 0);
      }
      this._paused();
    }
  }

  /** The numbers beside the timeline: makespan, bubble simulated and closed form, peaks. */
  function renderStats(container, d) {
    container.textContent = '';
    const dl = el('dl', {class: 'mc-stats'});
    const row = (label, value, attrs, note) => {
      const dd = el('dd', attrs || {}, [value]);
      if (note) dd.append(el('span', {class: 'mc-note', text: note}));
      dl.append(el('dt', {text: label}), dd);
    };
    row('Makespan', fmt(d.makespan), {'data-testid': 'makespan', 'data-value': String(d.makespan)});
    row('Bubble, simulated', fmt(d.bubble),
        {'data-testid': 'bubble', id: 'bubble-simulated', 'data-value': String(d.bubble), class: 'mc-big'});
    const cf = d.closed_form_bubble;
    if (cf === null || cf === undefined) {
      row('Bubble, closed form', '—', {'data-testid': 'bubble-closed', id: 'bubble-closed', 'data-value': ''},
          'none for these sizes and times');
    } else {
      const same = Math.abs(cf - d.bubble) <= 1e-9 * Math.max(1, Math.abs(cf));
      row('Bubble, closed form', fmt(cf),
          {'data-testid': 'bubble-closed', id: 'bubble-closed', 'data-value': String(cf), class: 'mc-big'},
          same ? 'equals the simulation' : `simulation differs by ${fmt(d.bubble - cf)}`);
    }
    const peaks = d.peak_activations;
    const top = peaks.reduce((best, v, i) => (v > peaks[best] ? i : best), 0);
    row('Peak activations', fmt(peaks[top], 3), {'data-testid': 'peak'}, `device ${top}, in micro-batches`);
    row('Ops', d.ops.length.toLocaleString('en-US'));
    container.append(dl,
      el('p', {class: 'mc-hint', text: 'Bubble = idle time \u00F7 busy time, over all devices. ' +
                                        'Time unit: the F, B, W you chose (per device\u2019s share of layers).'}));
  }

  function title(d) {
    return `${d.schedule} \u00B7 p = ${d.devices} devices \u00B7 m = ${d.microbatches} micro-batches \u00B7 ` +
           `v = ${d.chunks} chunk${d.chunks === 1 ? '' : 's'}`;
  }

  root.ModelcutTimeline = {Player, renderStats, title, fmt, PALETTE, opFill};
})(typeof window !== 'undefined' ? window : this);
