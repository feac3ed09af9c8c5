/* Helpers shared by the explorer and published-runs pages: JSON calls, number formats, SVG bars. */
(function (root) {
  'use strict';
  const SVG = 'http://www.w3.org/2000/svg';

  /** Time terms of the systems model's breakdown, in the order they stack. */
  const TIME_TERMS = [
    ['compute_s', 'compute', '#4e79a7'],
    ['tp_s', 'tensor parallel', '#f28e2b'],
    ['cp_s', 'context parallel', '#edc948'],
    ['a2a_s', 'expert all-to-all', '#e15759'],
    ['p2p_s', 'pipeline send', '#76b7b2'],
    ['bubble_s', 'bubble', '#b9bdc7'],
    ['dp_s', 'data parallel', '#b07aa1'],
  ];
  const MEMORY_TERMS = [
    ['weights_bytes', 'weights', '#4e79a7'],
    ['gradients_bytes', 'gradients', '#59a14f'],
    ['optimizer_bytes', 'optimizer states', '#9c755f'],
    ['activations_bytes', 'activations', '#f28e2b'],
    ['buffers_bytes', 'buffers allowance', '#b9bdc7'],
  ];

  async function api(method, url, body) {
    const opts = {method, headers: {}};
    if (body instanceof FormData) opts.body = body;
    else if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(url, opts);
    } catch (e) {
      throw new Error(`could not reach the server (${e.message})`);
    }
    const data = await res.json().catch(() => null);
    if (!res.ok) {
      const msg = data && typeof data.detail === 'string' ? data.detail : `the server answered ${res.status}`;
      throw new Error(msg);
    }
    return data;
  }

  function fmt(x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return '—';
    const d = digits === undefined ? 2 : digits;
    return x.toLocaleString('en-US', {maximumFractionDigits: d, minimumFractionDigits: 0});
  }
  function fixed(x, d) { return x === null || x === undefined ? '—' : x.toFixed(d); }
  function gb(bytes) { return (bytes / 1e9).toFixed(1) + ' GB'; }
  function seconds(s) {
    if (s === null || s === undefined) return '—';
    if (s >= 10) return s.toFixed(2) + ' s';
    if (s >= 0.01) return s.toFixed(3) + ' s';
    return (s * 1000).toFixed(2) + ' ms';
  }

  /** A mixture-of-experts layout's expert parallelism, with the experts' tensor parallelism where it is not
   *  tp ('ep 32, etp 1'); '' for a dense layout. Both pages name a layout's experts with it. */
  function expertsText(x) {
    if (!(x.ep > 1)) return '';
    return `ep ${x.ep}` + (x.etp != null && x.etp !== x.tp ? `, etp ${x.etp}` : '');
  }

  function h(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : v);
    }
    for (const c of [].concat(children || [])) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  function s(tag, attrs, children) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const c of [].concat(children || [])) if (c) e.append(c);
    return e;
  }

  /** A horizontal stacked bar (SVG) of `terms` ([key, label, colour]) from `values`, scaled so
   *  `scale` fills `width`; `marks` are vertical lines [value, colour, dash, label]. */
  function stackedBar(values, terms, scale, width, height, marks) {
    const svg = s('svg', {width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', class: 'bar'});
    let x = 0;
    const parts = [];
    for (const [key, label, colour] of terms) {
      const v = values[key] || 0;
      if (v <= 0) continue;
      const w = scale > 0 ? v / scale * width : 0;
      const r = s('rect', {x: x.toFixed(2), y: 2, width: Math.max(w, 0).toFixed(2), height: height - 4, fill: colour});
      r.append(s('title', {text: `${label}: ${values.__fmt ? values.__fmt(v) : fmt(v, 3)}`}));
      svg.append(r);
      parts.push(`${label} ${values.__fmt ? values.__fmt(v) : fmt(v, 3)}`);
      x += w;
    }
    for (const [v, colour, dash, label] of marks || []) {
      const mx = Math.min(width - 1, scale > 0 ? v / scale * width : 0);
      const ln = s('line', {x1: mx, x2: mx, y1: 0, y2: height, stroke: colour, 'stroke-width': 2,
                            'stroke-dasharray': dash || ''});
      ln.append(s('title', {text: label}));
      svg.append(ln);
    }
    svg.setAttribute('aria-label', parts.join(', '));
    return svg;
  }

  function legend(terms, extra) {
    const box = h('div', {class: 'legend-inline'});
    for (const [, label, colour] of terms) {
      const sw = h('span', {class: 'mc-swatch'});
      sw.style.background = colour;
      box.append(h('span', {}, [sw, label]));
    }
    for (const x of extra || []) box.append(x);
    return box;
  }

  /** A step's terms that take time, each with its swatch, seconds and share of the step (the breakdown's kv list). */
  function timeTerms(breakdown, step, attrs) {
    const kv = h('div', Object.assign({class: 'kv'}, attrs || {}));
    for (const [k, label, colour] of TIME_TERMS) {
      const v = breakdown[k] || 0;
      if (v <= 0) continue;
      const sw = h('span', {class: 'mc-swatch'}); sw.style.background = colour;
      kv.append(h('span', {}, [sw, ' ', label]), h('span', {class: 'num', text: seconds(v)}),
        h('span', {class: 'muted', text: `${fixed(v / step * 100, 1)} %`}));
    }
    return kv;
  }

  /** A budget line's detail: a product's shape, data type and TFLOP/s; memory-bound bytes; a collective's time before its overlap. */
  function layerDetail(ln) {
    if ('m' in ln) {
      return `${fmt(ln.m, 0)} × ${fmt(ln.n, 0)} × ${fmt(ln.k, 0)}${ln.count > 1 ? ` × ${ln.count}` : ''} ${ln.dtype}, `
        + `${fixed(ln.fwd_tflops, 0)} / ${fixed(ln.bwd_tflops, 0)} TFLOP/s`;
    }
    if (ln.fwd_tflops) return `${fixed(ln.fwd_tflops, 0)} / ${fixed(ln.bwd_tflops, 0)} TFLOP/s`;
    if ('fwd_bytes' in ln) return `${fmt(ln.fwd_bytes / 1e6, 1)} / ${fmt(ln.bwd_bytes / 1e6, 1)} MB`;
    if ('fwd_whole_s' in ln) return `of ${fixed(ln.fwd_whole_s * 1e3, 3)} / ${fixed(ln.bwd_whole_s * 1e3, 3)} ms before the overlap`;
    return '';
  }

  /** How the busiest device's micro-batch divides among products, attention, memory-bound kernels and exposed communication. */
  const KIND_TOTALS = {product: 'products', attention: 'attention cores', memory: 'memory-bound kernels',
                       tp: 'exposed tp collectives', cp: 'exposed cp exchanges', a2a: 'expert all-to-all',
                       recompute: 'recomputed forwards'};
  function kindShares(byKind) {
    const kinds = Object.entries(byKind).filter(([, v]) => v > 0);
    const total = kinds.reduce((a, [, v]) => a + v, 0);
    return `The micro-batch on this device, ${fmt(total * 1e3, 1)} ms: `
      + kinds.map(([k, v]) => `${KIND_TOTALS[k] || k} ${fixed(v / total * 100, 0)} %`).join(', ') + '.';
  }

  /** The layer that takes most of the busiest device's micro-batch, its lines as the step model charges them
   *  (the answer's layers, modelcut predict --layers): a heading, a line of context, the table. */
  function layerView(lb) {
    const layers = lb.units.filter((u) => u.unit.includes('layer') && u.per_device > 0);
    if (!layers.length) return [h('p', {class: 'muted small', text: 'no layer on the busiest device'})];
    const u = layers.reduce((a, b) => (b.per_device * (b.fwd_s + b.bwd_s) > a.per_device * (a.fwd_s + a.bwd_s) ? b : a));
    const rows = u.lines.map((ln) => h('tr', {}, [h('td', {text: ln.item}), h('td', {class: 'num', text: fixed(ln.fwd_s * 1e3, 3)}),
      h('td', {class: 'num', text: fixed(ln.bwd_s * 1e3, 3)}), h('td', {class: 'left', text: layerDetail(ln)})]));
    return [h('h3', {text: `One ${u.unit}, line by line: forward ${fixed(u.fwd_s * 1e3, 3)} ms, backward ${fixed(u.bwd_s * 1e3, 3)} ms`}),
      h('p', {class: 'small muted', text: `One micro-batch of ${lb.micro_batch} sequence${lb.micro_batch === 1 ? '' : 's'}, `
        + `${fmt(lb.tokens, 0)} tokens a device; the busiest device runs ${u.per_device} such layer${u.per_device === 1 ? '' : 's'} a micro-batch. `
        + 'Products: m × n × k on the device, forward / backward TFLOP/s; memory-bound kernels: forward / backward bytes '
        + '(modelcut predict --layers).'}),
      h('p', {class: 'small', 'data-testid': 'layer-kinds', text: kindShares(lb.by_kind_s)}),
      h('div', {class: 'hscroll'}, h('table', {class: 'data layer', 'data-testid': 'layer'}, [
        h('thead', {}, [h('tr', {}, ['Line', 'Forward ms', 'Backward ms', 'Detail'].map((t) => h('th', {text: t})))]),
        h('tbody', {}, rows)]))];
  }

  root.MC = {api, fmt, fixed, gb, seconds, expertsText, h, s, stackedBar, legend, layerView, timeTerms, TIME_TERMS, MEMORY_TERMS};
})(window);
