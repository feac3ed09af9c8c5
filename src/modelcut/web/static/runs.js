/* The published-runs page: GET /api/runs, a plot of predicted against published TFLOP/s per GPU
 * (one row per run, so no label overlaps another) and the validation table. */
(function () {
  'use strict';
  const {api, fmt, fixed, seconds, expertsText, h, s, stackedBar, legend, layerView, timeTerms, TIME_TERMS} = window.MC;
  const $ = (id) => document.getElementById(id);
  // The table's scroll box: the legend goes above it.
  const FAMILY = {megatron: '#4e79a7', llama3: '#e15759', zero3: '#59a14f'};
  const OTHER = ['#b07aa1', '#f28e2b', '#76b7b2', '#9c755f'];
  let data = null;
  let loads = 0;
  let picks = 0;   // the latest picked run's request: an earlier answer is dropped

  function colour(fam) {
    if (!FAMILY[fam]) FAMILY[fam] = OTHER[Object.keys(FAMILY).length % OTHER.length];
    return FAMILY[fam];
  }

  function niceStep(span, n) {
    const raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw))), r = raw / p;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * p;
  }

  /** A figure in the unit its source published: TFLOP/s per GPU, or seconds a step. */
  function inUnit(r, x) { return r.unit === 's' ? seconds(x) : fmt(x, 1); }

  /** The prediction the page leads with: under the default model the run predicted out of sample
   *  (constants fitted without its source, as validate leads with), else the row's own. */
  function shown(r) {
    const o = r.out_of_sample;
    return o ? {predicted: o.predicted, predicted_tflops: o.predicted_tflops, error_pct: o.error_pct}
      : {predicted: r.predicted, predicted_tflops: r.predicted_tflops, error_pct: r.error_pct};
  }
  function signed(e) { return `${e > 0 ? '+' : '−'}${fixed(Math.abs(e), 1)} %`; }

  function plot() {
    const box = $('plot');
    box.textContent = '';
    if (!data) return;
    // The plot is in TFLOP/s per GPU; runs whose source published a step time are in the table.
    const rows = data.runs.filter((r) => r.published_tflops !== null && r.published_tflops !== undefined);
    const timed = data.runs.length - rows.length;
    if (!rows.length) {
      box.append(h('p', {class: 'muted', text: 'Every run here was published as a step time: see the table.'}));
      return;
    }
    const W = Math.max(560, box.clientWidth || 900);
    // Type follows the page's size (larger on projectors, see style.css).
    const k = (parseFloat(getComputedStyle(document.documentElement).fontSize) || 16) / 16;
    const fs = Math.round(13 * k);
    const rowH = Math.round(28 * k), top = Math.round(40 * k), bottom = Math.round(44 * k);
    const left = Math.round(230 * k), right = Math.round(120 * k);
    const H = top + rows.length * rowH + bottom;
    const vals = rows.flatMap((r) => [r.published_tflops, shown(r).predicted_tflops]);
    const step = niceStep(Math.max(...vals) - Math.min(...vals) || 1, 6);
    const lo = Math.floor(Math.min(...vals) * 0.95 / step) * step;
    const hi = Math.ceil(Math.max(...vals) * 1.03 / step) * step;
    const x = (v) => left + (v - lo) / (hi - lo) * (W - left - right);
    const svg = s('svg', {width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img',
                          'aria-label': 'Predicted against published TFLOP/s per GPU for each run'});
    // Grid and axis.
    for (let v = lo; v <= hi + step * 1e-9; v += step) {
      svg.append(s('line', {x1: x(v), x2: x(v), y1: top - 6, y2: H - bottom + 4, stroke: '#e3e5ea'}));
      svg.append(s('text', {x: x(v), y: H - bottom + Math.round(20 * k), 'text-anchor': 'middle', 'font-size': fs, fill: '#5b6170',
                            text: fmt(v, 0)}));
    }
    svg.append(s('text', {x: (left + W - right) / 2, y: H - 8, 'text-anchor': 'middle', 'font-size': fs,
                          fill: '#1f2430', text: 'TFLOP/s per GPU'}));
    const oos = rows.some((r) => r.out_of_sample);
    svg.append(s('text', {x: W - right + 12, y: top - 14, 'font-size': fs, fill: '#5b6170',
                          text: oos ? 'out of sample' : 'error'}));
    // Legend: above the plot as text that wraps, so it never runs into the error column at any width.
    const leg = h('div', {class: 'plot-legend', 'data-testid': 'plot-legend'});
    const key = (cls, label, colour) => {
      const sw = h('span', {class: `mc-swatch ${cls}`});
      if (colour) sw.style.background = colour;
      leg.append(h('span', {}, [sw, label]));
    };
    key('ring', 'published');
    key('dot', oos ? 'predicted out of sample (colour: family)' : 'predicted (colour: family)');
    for (const f of new Set(rows.map((r) => r.family))) key('', f, colour(f));
    box.append(leg);
    rows.forEach((r, i) => {
      const y = top + i * rowH + rowH / 2;
      if (i % 2 === 0) svg.append(s('rect', {x: 0, y: y - rowH / 2, width: W, height: rowH, fill: '#f7f8fb'}));
      svg.append(s('text', {x: left - 14, y: y + 5, 'text-anchor': 'end', 'font-size': fs, fill: '#1f2430',
                            text: r.id}));
      const g = s('g', {'data-run': r.id});
      const sh = shown(r);
      g.append(s('title', {text: `${r.id}: published ${fmt(r.published_tflops, 1)}, predicted `
        + `${fmt(sh.predicted_tflops, 1)} TFLOP/s per GPU (${r.fitted ? 'fitted' : signed(sh.error_pct)}`
        + (r.out_of_sample ? ` out of sample; ${signed(r.error_pct)} in sample)` : ')')}));
      g.append(s('line', {x1: x(r.published_tflops), x2: x(sh.predicted_tflops), y1: y, y2: y,
                          stroke: '#9aa0ad', 'stroke-width': 3}));
      g.append(s('circle', {cx: x(sh.predicted_tflops), cy: y, r: 6.5, fill: colour(r.family)}));
      g.append(s('circle', {cx: x(r.published_tflops), cy: y, r: 7, fill: 'none', stroke: '#1f2430', 'stroke-width': 2}));
      svg.append(g);
      svg.append(s('text', {x: W - right + 12, y: y + 5, 'font-size': fs,
                            fill: r.fitted ? '#5b6170' : '#1f2430',
                            text: r.fitted ? 'fitted (η)' : signed(sh.error_pct)}));
    });
    box.append(svg);
    if (timed) {
      box.append(h('p', {class: 'small muted', 'data-testid': 'timed-runs',
                         text: `${timed} run${timed === 1 ? '' : 's'} published as seconds a step: in the table below.`}));
    }
  }

  function table() {
    const t = $('runs');
    t.textContent = '';
    const oos = data.runs.some((r) => r.out_of_sample);
    const heads = [['Run'], ['GPUs'], ['tp·cp·pp·dp', 'tensor · context · pipeline · data parallel; a second line '
        + 'gives the expert parallelism of a mixture of experts (and its expert tensor parallelism where it differs)'],
      ['Schedule'], ['Published', 'as the source reports it: TFLOP/s per GPU, or seconds a step'],
      oos ? ['Predicted', 'out of sample: with the constants fitted without the run\'s source, in the published unit']
        : ['Predicted', 'in the published unit'],
      oos ? ['Error', 'out of sample'] : ['Error']]
      .concat(oos ? [['In sample', 'the error with the shipped constants, fitted on every run']] : [])
      .concat([['Step', 'predicted step time (in sample)'], ['Where the step goes', 'shares of the predicted step time (in sample)']]);
    t.append(h('thead', {}, h('tr', {}, heads
      .map(([x, title]) => h('th', {scope: 'col', text: x, title, class: x === 'Schedule' ? 'left' : null})))));
    const body = h('tbody');
    for (const r of data.runs) {
      const L = r.layout, sh = shown(r);
      const cell = (e) => h('td', {class: e < 0 ? 'neg' : 'pos', text: signed(e)});
      const err = r.fitted ? h('td', {class: 'muted', text: 'fitted'}) : cell(sh.error_pct);
      body.append(h('tr', {title: `${r.model} on ${r.gpu}. ${r.source}` + (r.notes ? ` — ${r.notes}` : ''),
                           'data-id': r.id, onclick: () => showRun(r.id)}, [
        h('td', {text: r.id}),
        h('td', {text: fmt(r.gpus, 0)}),
        h('td', {}, [`${L.tp}·${L.cp}·${L.pp}·${L.dp}`].concat(L.ep > 1
          ? [h('br'), h('span', {class: 'small muted', 'data-testid': 'ep',
                                 text: expertsText(L)})] : [])),
        h('td', {class: 'left'}, L.pp === 1 ? ['\u2014'] : [L.schedule].concat(L.vpp > 1
          ? [h('br'), h('span', {class: 'small muted', text: `v = ${L.vpp}`})] : [])),
        h('td', {text: inUnit(r, r.published)}), h('td', {text: inUnit(r, sh.predicted)}), err,
        ...(oos ? [r.out_of_sample ? cell(r.error_pct) : h('td', {class: 'muted', text: '\u2014'})] : []),
        h('td', {text: seconds(r.step_time_s)}),
        h('td', {class: 'bars-cell'}, stackedBar(Object.assign({__fmt: seconds}, r.breakdown), TIME_TERMS, r.step_time_s, 150, 16)),
      ]));
    }
    t.append(body);
    t.parentElement.before(legend(TIME_TERMS));
    const box = $('sources');
    box.textContent = '';
    const det = h('details', {}, [h('summary', {text: `Sources and accelerators (${data.runs.length} runs)`})]);
    const ul = h('ul');
    for (const r of data.runs) {
      ul.append(h('li', {text: `${r.id}: ${r.model} on ${fmt(r.gpus, 0)} × ${r.gpu}. ${r.source}`
        + (r.notes ? ` (${r.notes})` : '')}));
    }
    det.append(ul);
    box.append(det);
  }

  /** One run predicted again as validate predicts it (GET /api/runs/{id}, modelcut predict --run ID): where
   *  its step goes and, under the default model, its longest layer line by line. */
  async function showRun(id) {
    for (const tr of $('runs').querySelectorAll('tbody tr')) tr.classList.toggle('picked', tr.dataset.id === id);
    const box = $('run-detail');
    const mode = data.mode;
    box.textContent = '';
    box.append(h('h2', {text: id}), h('p', {class: 'muted small', text: 'loading…'}));
    const mine = ++picks;
    try {
      const p = await api('GET', `/api/runs/${encodeURIComponent(id)}?` + new URLSearchParams({mode, layers: mode === 'default'}));
      if (mine !== picks) return;
      box.textContent = '';
      const L = p.layout, pub = p.published || {};
      box.append(h('h2', {text: `${id}: tp ${L.tp} · cp ${L.cp} · pp ${L.pp} · dp ${L.dp}, ${p.schedule}`
        + (p.vpp > 1 ? `, v = ${p.vpp}` : '') + `, ${p.microbatches} micro-batch${p.microbatches === 1 ? '' : 'es'}`}));
      const o = pub.out_of_sample;
      const err = pub.error_pct === undefined ? ''
        : (o ? `; error out of sample ${signed(o.error_pct)} (constants fitted without ${o.source_left_out}), in sample ${signed(pub.error_pct)}`
          : `; error ${signed(pub.error_pct)}`) + ` against the measured ${seconds(pub.measured_step_time_s)}`;
      box.append(h('p', {class: 'why', text: `Predicted step ${seconds(p.step_time_s)}, ${fmt(p.tflops_per_gpu, 0)} TFLOP/s per GPU, `
        + `MFU ${fixed(p.mfu * 100, 1)} % (${p.mode} model${L.framework ? `, ${L.framework}` : ''})${err}.`}));
      box.append(h('div', {class: 'chart'}, stackedBar(Object.assign({__fmt: seconds}, p.breakdown), TIME_TERMS, p.step_time_s, 420, 24)));
      box.append(timeTerms(p.breakdown, p.step_time_s, {'data-testid': 'run-terms'}));
      if (p.layers) box.append(...layerView(p.layers));
      else box.append(h('p', {class: 'small muted', text: 'The seed model sums terms; the default model itemises a layer.'}));
    } catch (e) {
      if (mine !== picks) return;
      box.lastChild.textContent = e.message;
    }
  }

  function summary() {
    const sm = data.summary;
    $('summary').textContent = '';
    if (data.mode === 'seed') {
      const fams = Object.entries(sm.max_error_pct).map(([f, e]) => `${f} ${fixed(e, 1)} %`).join(', ');
      $('summary').append(h('strong', {text: `Seed model: η = ${fixed(data.eta, 3)}`}),
        ` fitted on ${data.calibration}; every other row is a prediction (${sm.predicted} runs). Largest error: ${fams}; `
        + `mean ${fixed(sm.mean_abs_error_pct, 1)} %. Every prediction low: ${sm.all_low ? 'yes' : 'no'}.`);
      return;
    }
    const signs = sm.signs ? ` ${sm.signs.low} predictions low, ${sm.signs.high} high.` : '';
    const o = sm.out_of_sample;
    const first = o && o.runs ? ` Out of sample (each source's runs predicted with the constants fitted without that source): `
      + `mean |error| ${fixed(o.mean_abs_error_pct, 1)} %, largest ${fixed(o.max_abs_error_pct, 1)} %, mean ${signed(o.mean_signed_error_pct)}.` : '';
    $('summary').append(h('strong', {text: "Default model (modelcut's)"}),
      `: every row is a prediction (${sm.predicted} runs).${first} In sample (the shipped constants, fitted on every run): `
      + `mean |error| ${fixed(sm.mean_abs_error_pct, 1)} %, largest ${fixed(sm.max_abs_error_pct, 1)} %.${signs}`);
  }

  function clear() {
    data = null;
    $('summary').textContent = '';
    $('plot').textContent = '';
    $('runs').textContent = '';
    $('sources').textContent = '';
    $('run-detail').textContent = '';
    for (const e of document.querySelectorAll('.legend-inline')) e.remove();
  }

  async function load() {
    $('error').textContent = '';
    const q = new URLSearchParams({set: $('set').value, mode: $('mode').value});
    history.replaceState(null, '', location.pathname + '?' + q.toString());
    const mine = ++loads;
    try {
      const ans = await api('GET', '/api/runs?' + q.toString());
      if (mine !== loads) return;   // a later choice's answer wins, whichever comes back first
      data = ans;
      picks++;
      $('run-detail').textContent = '';   // a run picked under the other model or set
      summary();
      plot();
      for (const e of document.querySelectorAll('.legend-inline')) e.remove();
      table();
    } catch (e) {
      if (mine !== loads) return;
      clear();   // no stale table under the message
      $('error').textContent = e.message;
    }
  }

  const q = new URLSearchParams(location.search);
  if (q.get('set')) $('set').value = q.get('set') === 'all' ? 'all' : 'deck';
  api('GET', '/api/catalog').then((cat) => {
    const sel = $('mode');
    const want = q.get('mode') || sel.value;
    sel.textContent = '';
    for (const m of cat.modes) sel.append(h('option', {value: m, text: m}));
    if (cat.modes.includes(want) && want !== 'seed') { sel.value = want; load(); }
  }).catch(() => {});
  $('set').addEventListener('change', load);
  $('mode').addEventListener('change', load);
  let w = 0;
  if (window.ResizeObserver) {
    new ResizeObserver(() => { const nw = $('plot').clientWidth; if (nw !== w) { w = nw; plot(); } }).observe($('plot'));
  }
  load();
})();
