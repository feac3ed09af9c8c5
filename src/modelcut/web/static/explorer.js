/* The layout explorer: POST /api/explore, ranked layouts with time and memory bars, one picked
 * layout's device mesh (POST /api/mesh) and a link that animates its pipeline on the pipeline page. */
(function () {
  'use strict';
  const {api, fmt, fixed, gb, seconds, expertsText, h, s, stackedBar, legend, layerView, timeTerms, TIME_TERMS, MEMORY_TERMS} = window.MC;
  const $ = (id) => document.getElementById(id);
  const UPLOAD = '__upload__';
  const KNOB_NAME = {cp_kind: 'context-parallel form', micro_batch: 'micro-batch', vpp: 'chunks v', zero: 'ZeRO'};
  const DEFAULTS = {model: 'llama3-8b', gpu: 'h100-sxm5-80gb', gpus: '64', seq: '8192', tokens: '4M', top: '20',
                    framework: '', precision: 'bf16', recipe: '', reduce: '', attention: '', local: ''};   // framework: the catalog's default, set on load
  const LIMIT = '#b3261e';   // the memory limit's mark: a solid red line, not a dashed one (no menu look-alike)
  let hfConfig = null;
  let last = null;
  let lastBody = null;   // the form's body behind ``last``: its model (catalog name or config) for a trace
  let hardware = {};
  let stackRecipes = {};

  function showError(msg) { $('error').textContent = msg || ''; }

  function termLabel(key) {
    for (const t of [...TIME_TERMS, ...MEMORY_TERMS]) if (t[0] === key) return t[1];
    return key;
  }

  /** ep (and the experts' tensor parallelism where it is not tp) of a mixture-of-experts layout. */
  function expertsName(x) { return x.ep > 1 ? ` · ${expertsText(x)}` : ''; }
  /** dp, with the shard group where ZeRO's states are sharded within it and replicated across (hybrid sharding). */
  function dpName(x) { return x.dp_shard ? `${x.dp}[${x.dp_shard}]` : `${x.dp}`; }
  /** Context parallelism's form as the page names it (the API's cp_kind: ring, allgather, a2a, a2a+p2p with
   *  cp_a2a, its all-to-all groups' size). */
  const CP_FORM = {};   // each form's label, from the catalog (GET /api/catalog cp_kinds)
  function cpForm(x) {
    if (x.cp_kind === 'a2a+p2p') return `all-to-all ${x.cp_a2a} · ring ${x.cp / x.cp_a2a}`;
    return CP_FORM[x.cp_kind] || x.cp_kind;
  }
  function layoutName(x) {
    return `tp ${x.tp} · cp ${x.cp}` + (x.cp > 1 ? ` (${cpForm(x)})` : '') + ` · pp ${x.pp} · dp ${dpName(x)}` + expertsName(x);
  }
  function scheduleName(x) {
    if (x.pp === 1) return 'no pipeline';   // pp 1 runs no schedule
    const last = x.last_layers ? `, last rank ${x.last_layers} layers` : '';
    return (x.vpp > 1 ? `${x.schedule}, v = ${x.vpp}` : x.schedule) + last;
  }

  /** The GPU as the API takes it: a catalog name, held to the power limit field's watts where set. */
  function gpuName() {
    const w = $('watts').value.trim();
    if (!w || $('watts').disabled) return $('gpu').value;
    const x = Number(w);
    if (!Number.isFinite(x) || x <= 0) throw new Error('Power limit: a positive number of watts');
    return `${$('gpu').value}@${x}w`;
  }

  /** The power limit field for the chosen GPU: its datasheet limit as the hint and its range, off where no cap can be derived. */
  function fitWatts() {
    const hw = hardware[$('gpu').value] || {};
    const capped = Boolean(hw.cappable);   // the server's word (Hardware.cappable)
    $('watts').disabled = !capped;
    $('watts').max = capped ? String(hw.power_w) : '';
    $('watts').min = capped ? String(hw.power_min_w) : '1';
    $('watts').placeholder = capped ? `${hw.power_w} (its limit)` : 'no cap';
    if (!capped) $('watts').value = '';
  }

  function readForm() {
    const body = {gpu: gpuName()};
    if ($('model').value === UPLOAD) body.hf_config = hfConfig;
    else body.model = $('model').value;
    const ints = {gpus: 'GPUs', seq: 'Sequence', top: 'Show top'};
    for (const [k, label] of Object.entries(ints)) {
      const x = Number($(k).value);
      if (!Number.isInteger(x) || x < 1) throw new Error(`${label}: a whole number of 1 or more`);
      body[k] = x;
    }
    const tok = $('tokens').value.trim();
    body.global_batch_tokens = /^\d+$/.test(tok) ? Number(tok) : tok;
    const scheds = [...document.querySelectorAll('input[name=schedule]:checked')].map((e) => e.value);
    if (!scheds.length) throw new Error('choose at least one schedule');
    body.schedules = scheds;
    const kinds = [...document.querySelectorAll('input[name=cp_kind]:checked')].map((e) => e.value);
    if (!kinds.length) throw new Error('choose at least one context-parallel form');
    body.cp_kinds = kinds;
    body.allow_tp_across_nodes = $('across').checked;
    body.framework = $('framework').value;
    const prec = $('precision').value;
    if (prec.includes(',')) body.precisions = prec.split(',');   // one search per precision, side by side
    else body.precision = prec;
    if (prec.split(',').includes('fp8') && $('recipe').value) body.fp8_recipe = $('recipe').value;
    if ($('reduce').value) body.grad_reduce = $('reduce').value;   // the gradients' reduce type (empty: the stack's)
    if ($('attention').value) body.attention = $('attention').value;   // the attention kernel (empty: the stack's)
    const local = $('local').value.trim();   // a pipeline's schedule run a local batch (empty: one run a step)
    if (local) {
      const x = Number(local);
      if (!Number.isInteger(x) || x < 1) throw new Error('Local batch: a whole number of 1 or more, or empty');
      body.local_batch = x;
    }
    return body;
  }

  function writeUrl(body) {
    const q = new URLSearchParams();
    if (body.model) q.set('model', body.model);
    q.set('gpu', body.gpu);
    q.set('gpus', body.gpus);
    q.set('seq', body.seq);
    q.set('tokens', String(body.global_batch_tokens));
    q.set('top', body.top);
    q.set('schedules', body.schedules.join(','));
    if (body.cp_kinds.length < document.querySelectorAll('input[name=cp_kind]').length) {
      q.set('cpkinds', body.cp_kinds.join(','));
    }
    if (body.allow_tp_across_nodes) q.set('across', '1');
    if (body.framework && body.framework !== DEFAULTS.framework) q.set('framework', body.framework);
    const prec = body.precisions ? body.precisions.join(',') : body.precision;
    if (prec !== DEFAULTS.precision) q.set('precision', prec);
    if (body.fp8_recipe) q.set('recipe', body.fp8_recipe);
    if (body.grad_reduce) q.set('reduce', body.grad_reduce);
    if (body.attention) q.set('attention', body.attention);
    if (body.local_batch) q.set('local', body.local_batch);
    history.replaceState(null, '', location.pathname + '?' + q.toString());
  }

  function readUrl() {
    const q = new URLSearchParams(location.search);
    const st = Object.assign({}, DEFAULTS);
    for (const k of Object.keys(DEFAULTS)) if (q.get(k)) st[k] = q.get(k);
    st.schedules = q.get('schedules') ? q.get('schedules').split(',') : null;
    st.cpKinds = q.get('cpkinds') ? q.get('cpkinds').split(',') : null;
    st.across = q.get('across') === '1';
    return st;
  }

  /** The search's progress bar: done of total shapes searched, or waiting for a worker. */
  function showProgress(p) {
    const box = $('progress'), bar = $('search-progress'), text = $('progress-text');
    if (!p) { box.hidden = true; return; }
    box.hidden = false;
    if (!p.running || !p.total) {
      bar.removeAttribute('value');   // indeterminate: queued, or counting the space
      bar.dataset.value = '';
      text.textContent = p.running ? 'searching…' : 'waiting for a search worker…';
      return;
    }
    const f = Math.min(1, p.done / p.total);
    bar.value = f;
    bar.dataset.value = String(f);
    text.textContent = `${fmt(p.done, 0)} of ${fmt(p.total, 0)} shapes searched`;
  }

  /** POST /api/explore/stream: NDJSON lines of progress, then the answer (or its refusal). */
  async function streamSearch(body, onProgress) {
    let res;
    try {
      res = await fetch('/api/explore/stream', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                                body: JSON.stringify(body)});
    } catch (e) {
      throw new Error(`could not reach the server (${e.message})`);
    }
    if (!res.ok) {
      const data = await res.json().catch(() => null);
      const wait = res.headers.get('Retry-After');
      let msg = data && typeof data.detail === 'string' ? data.detail : `the server answered ${res.status}`;
      if (res.status === 429 && wait && !msg.includes('retry')) msg += ` (retry in ${wait} s)`;
      throw new Error(msg);
    }
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = '', answer = null;
    for (;;) {
      const {value, done} = await reader.read();
      if (value) buf += dec.decode(value, {stream: true});
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!line) continue;
        const msg = JSON.parse(line);
        if (msg.progress) onProgress(msg.progress);
        if (msg.error) throw new Error(msg.error.detail);
        if (msg.result) answer = msg.result;
      }
      if (done) break;
    }
    if (!answer) throw new Error('the search ended without an answer');
    return answer;
  }

  async function search() {
    let body;
    try { body = readForm(); } catch (e) { showError(e.message); return; }
    showError('');
    if (body.model) writeUrl(body);
    $('go').disabled = true;
    $('go').textContent = 'Searching…';
    $('table-wrap').classList.add('busy');
    showProgress({done: 0, total: null, running: false});
    const t0 = performance.now();
    try {
      const ans = await streamSearch(body, showProgress);
      const secs = (performance.now() - t0) / 1000;
      renderPrecisions(ans);
      const shown = ans.searches ? ans.searches[Math.max(0, ans.precisions.indexOf(ans.fastest))] : ans;
      last = shown;
      lastBody = body;
      render(shown, secs);
    } catch (e) {
      showError(e.message);
    } finally {
      $('go').disabled = false;
      $('go').textContent = 'Explore layouts';
      $('table-wrap').classList.remove('busy');
      showProgress(null);
    }
  }

  /** A search per precision (the request named precisions): each one's best layout side by side;
   * the fastest precision's search is the one rendered below. Empty for a one-precision answer. */
  function renderPrecisions(ans) {
    const box = $('precisions');
    box.textContent = '';
    if (!ans.searches) return;
    const first = ans.searches[0].layouts[0];
    const rows = ans.searches.map((a, i) => {
      const x = a.layouts[0];
      const name = ans.precisions[i] + (a.fp8_recipe ? ` (${a.fp8_recipe})` : '');
      if (!x) return h('tr', {}, [h('td', {text: name}), h('td', {colspan: 4, text: 'no layout fits'})]);
      return h('tr', {'data-precision': ans.precisions[i]}, [
        h('td', {text: name}), h('td', {text: `${layoutName(x)}, ${scheduleName(x)}`}),
        h('td', {class: 'num', text: `${fixed(x.step_time_s, 3)} s`}), h('td', {class: 'num', text: gb(x.memory.peak_bytes)}),
        h('td', {class: 'num', text: first ? `${fixed(first.step_time_s / x.step_time_s, 2)}×` : '—'})]);
    });
    box.append(
      h('p', {text: `One search per precision, each one's best layout; the fastest precision's ranking, ${ans.fastest || 'none'}, follows.`}),
      h('table', {class: 'data', 'data-testid': 'precisions'}, [
        h('thead', {}, [h('tr', {}, ['precision', 'best layout', 'step', 'peak memory', `speed-up over ${ans.precisions[0]}`]
          .map((t) => h('th', {text: t})))]),
        h('tbody', {}, rows)]));
  }

  function render(ans, secs) {
    const sum = ans.summary;
    const hw = ans.hardware;
    $('summary').textContent = '';
    $('summary').append(
      h('p', {}, [h('strong', {text: `${fmt(sum.ranked, 0)} layouts fit`}),
        ` of ${fmt(sum.space, 0)} covered (${fmt(sum.structures, 0)} shapes × recomputation × ZeRO stage), `
        + `searched in ${secs.toFixed(1)} s.`]),
      h('p', {text: `Memory limit ${gb(sum.limit_bytes)}: ${hw.name}'s ${gb(sum.capacity_bytes)} less a `
        + `${fmt(sum.margin * 100, 1)} % margin. Model: ${ans.model.name}, ${ans.model.layers} layers.`}),
      h('p', {'data-testid': 'stack', text: `Stack: ${ans.framework || DEFAULTS.framework}; matrix products in `
        + `${ans.precision}${ans.fp8_recipe ? `, ${ans.fp8_recipe} scaling` : ''}`
        + `${ans.grad_reduce ? `; gradients reduced in ${ans.grad_reduce}` : ''}`
        + `${ans.attention ? `; attention by ${ans.attention}` : ''}`
        + `${ans.local_batch ? `; a pipeline runs its schedule once per ${ans.local_batch} sequences a replica` : ''}.`}));
    for (const n of ans.notes) $('summary').append(h('p', {class: 'muted', text: n}));
    $('title').textContent = `${ans.model.name} on ${fmt(sum.gpus, 0)} × ${hw.name}: layouts that fit, fastest first`;
    renderWhy(ans);
    $('legends').textContent = '';
    const cap = h('span', {}, [h('span', {class: 'mc-swatch limit-mark'}), 'memory limit']);
    $('legends').append(
      h('div', {class: 'small muted', text: 'Time per step:'}), legend(TIME_TERMS.filter(([k]) => ans.layouts.some((x) => x.breakdown && x.breakdown[k] > 0))),
      h('div', {class: 'small muted', text: 'Memory of the fullest device:'}), legend(MEMORY_TERMS, [cap]));
    renderTable(ans);
    $('detail').textContent = '';
    if (ans.layouts.length) pick(0);
  }

  function renderWhy(ans) {
    const el = $('why');
    el.textContent = '';
    if (!ans.layouts.length) {
      const why = ans.none_reason || 'no layout fits in memory: try more GPUs, a shorter sequence or a smaller batch';
      el.textContent = `${why}.`;
      return;
    }
    const best = ans.layouts[0];
    el.append(h('strong', {text: `Best: ${layoutName(best)}, ${scheduleName(best)}, micro-batch ${best.micro_batch}, `
      + `recompute ${recomputeName(best)}, ZeRO ${best.zero}`}),
      ` — ${seconds(best.step_time_s)} per step, ${fmt(best.tflops_per_gpu, 0)} TFLOP/s per GPU, `
      + `MFU ${fixed(best.mfu * 100, 1)} %.`);
    if (ans.why) {
      const w = ans.why;
      const gap = w.step_time_s[1] - w.step_time_s[0];
      const terms = w.time_terms.filter((t) => Math.abs(t.difference) > 1e-9).slice(0, 2)
        .map((t) => `${seconds(Math.abs(t.difference))} ${t.difference > 0 ? 'more' : 'less'} ${termLabel(t.term)}`);
      const knobs = Object.entries(w.knobs).filter(([, [a, b]]) => a !== null && b !== null)
        .map(([k, [a, b]]) => `${KNOB_NAME[k] || k.replace('_', ' ')} ${b} instead of ${a}`);
      const other = `the runner-up (${knobs.join(', ') || 'same knobs'})`;
      if (gap <= 1e-9 * Math.max(1, w.step_time_s[0])) {
        el.append(h('br'), `It ties with ${other} on step time and needs less memory.`);
      } else {
        const u = w.pipeline;
        el.append(h('br'), `It beats ${other} by ${seconds(gap)} per step`
          + (terms.length ? `; the runner-up spends ${terms.join(' and ')}` : '')
          + (u ? `; its pipeline rank ${u.device} works ${seconds(u.busy_s)} against ${seconds(u.mean_s)} `
            + `on the average rank (it holds ${u.holds})` : '') + '.');
      }
    }
  }

  function renderTable(ans) {
    const table = $('layouts');
    table.textContent = '';
    const head = h('tr', {}, [['#'], ['tp·cp·pp·dp', "tensor · context · pipeline · data parallel; with cp > 1, "
        + "context parallelism's form: ring (Megatron-LM's p2p), all-gather, all-to-all (Ulysses), or hierarchical "
        + "(a2a+p2p): all-to-all within groups of A ranks, a ring across the cp/A groups (all-to-all A · ring cp/A)"],
      ['Schedule'], ['v', 'chunks per device'],
      ['b', 'micro-batch, sequences'], ['Recompute'], ['ZeRO'], ['Step'], ['TFLOP/s', 'per GPU'], ['Time per step'],
      ['Memory', 'the fullest device against the memory limit']]
      .map(([t, title]) => h('th', {scope: 'col', text: t, title,
        class: ['tp·cp·pp·dp', 'Schedule', 'Recompute'].includes(t) ? 'left' : t === 'Memory' ? 'sticky-end' : null})));
    table.append(h('thead', {}, head));
    const tbody = h('tbody');
    const maxT = Math.max(...ans.layouts.map((x) => x.step_time_s), 1e-9);
    const capacity = ans.summary.capacity_bytes;
    ans.layouts.forEach((x, i) => {
      const tb = Object.assign({__fmt: seconds}, x.breakdown);
      const mem = Object.assign({__fmt: gb}, x.memory);
      const tr = h('tr', {'data-rank': x.rank, tabindex: 0, onclick: () => pick(i),
                         onkeydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { pick(i); e.preventDefault(); } }}, [
        h('td', {text: String(x.rank)}),
        h('td', {class: 'left'}, [`${x.tp}·${x.cp}·${x.pp}·${dpName(x)}` + expertsName(x)].concat(x.cp > 1
          ? [h('br'), h('span', {class: 'small muted', 'data-testid': 'cp-form', text: cpForm(x)})] : [])),
        h('td', {class: 'left', text: x.pp === 1 ? '\u2014' : x.schedule + (x.last_layers ? `, last ${x.last_layers}` : '')}),
        h('td', {text: String(x.vpp)}),
        h('td', {text: String(x.micro_batch)}),
        h('td', {class: 'left', text: recomputeName(x)}),
        h('td', {text: String(x.zero)}),
        h('td', {text: seconds(x.step_time_s)}),
        h('td', {text: fmt(x.tflops_per_gpu, 0)}),
        h('td', {class: 'bars-cell'}, cell(stackedBar(tb, TIME_TERMS, maxT, 120, 18))),
        h('td', {class: 'bars-cell sticky-end', 'data-testid': 'memory-cell'},
          cell(stackedBar(mem, MEMORY_TERMS, capacity, 100, 18,
            [[ans.summary.limit_bytes, LIMIT, '', `limit ${gb(ans.summary.limit_bytes)}`]]))),
      ]);
      tbody.append(tr);
    });
    table.append(tbody);
  }

  async function pick(i) {
    const ans = last;
    const x = ans.layouts[i];
    for (const tr of $('layouts').querySelectorAll('tbody tr')) tr.classList.toggle('picked', Number(tr.dataset.rank) === x.rank);
    const d = $('detail');
    d.textContent = '';
    d.append(h('h2', {text: `Layout #${x.rank}: ${layoutName(x)}, ${scheduleName(x)}`}));
    const grid = h('div', {class: 'detail-grid'});
    // Time.
    const tcol = h('div', {}, [h('h3', {text: `Time per step: ${seconds(x.step_time_s)}`})]);
    const tb = Object.assign({__fmt: seconds}, x.breakdown);
    tcol.append(wide(stackedBar(tb, TIME_TERMS, x.step_time_s, 420, 24)));
    tcol.append(timeTerms(x.breakdown, x.step_time_s), h('p', {class: 'small muted', text: `${x.microbatches} micro-batch${x.microbatches === 1 ? '' : 'es'} of ${x.micro_batch} sequence${x.micro_batch === 1 ? '' : 's'} `
      + `per pipeline; ${fmt(x.tflops_per_gpu, 0)} TFLOP/s per GPU, MFU ${fixed(x.mfu * 100, 1)} %.`}));
    // Memory.
    const mcol = h('div', {}, [h('h3', {text: `Memory: ${gb(x.memory.peak_bytes)} on the fullest device (stage ${x.memory.peak_stage})`})]);
    const mem = Object.assign({__fmt: gb}, x.memory);
    mcol.append(wide(stackedBar(mem, MEMORY_TERMS, ans.summary.capacity_bytes, 420, 24,
      [[ans.summary.limit_bytes, LIMIT, '', `limit ${gb(ans.summary.limit_bytes)}`]])));
    const mkv = h('div', {class: 'kv'});
    for (const [k, label, colour] of MEMORY_TERMS) {
      const sw = h('span', {class: 'mc-swatch'}); sw.style.background = colour;
      mkv.append(h('span', {}, [sw, ' ', label]), h('span', {class: 'num', text: gb(x.memory[k] || 0)}),
        h('span', {class: 'muted', text: `${fixed((x.memory[k] || 0) / ans.summary.capacity_bytes * 100, 1)} % of ${gb(ans.summary.capacity_bytes)}`}));
    }
    mcol.append(mkv);
    // One column a pipeline stage; with one stage the bar above is that device already.
    if (x.memory.stages_total_bytes.length > 1)
      mcol.append(stageColumns(x.memory.stages_total_bytes, ans.summary.capacity_bytes, ans.summary.limit_bytes));
    grid.append(tcol, mcol);
    d.append(grid);
    // Pipeline link.
    const actions = h('div', {class: 'actions'});
    if (x.pp > 1) {
      const q = new URLSearchParams({schedule: x.schedule, devices: x.pp, microbatches: x.microbatches, chunks: x.vpp});
      actions.append(h('a', {class: 'button primary', href: '/?' + q.toString(), 'data-testid': 'animate',
        text: `Animate its pipeline: ${x.schedule}, p = ${x.pp}, m = ${x.microbatches}, v = ${x.vpp} \u2192`}),
        h('span', {class: 'small muted', text: 'uniform stages, F : B = 1 : 2'}));
    } else {
      actions.append(h('span', {class: 'muted', text: 'No pipeline in this layout (pp = 1).'}));
    }
    const traceBtn = h('button', {type: 'button', class: 'button', 'data-testid': 'trace',
      text: 'Download its step as a trace (Perfetto)',
      title: 'the predicted step as a Chrome trace-event file: open it at ui.perfetto.dev'});
    traceBtn.addEventListener('click', () => downloadTrace(ans, x, traceBtn));
    actions.append(traceBtn);
    d.append(actions);
    // One layer, line by line (POST /api/predict with layers: modelcut predict --layers).
    const layerBox = h('section', {}, [h('h3', {text: 'One layer, line by line'}), h('p', {class: 'muted small', text: 'loading…'})]);
    d.append(layerBox);
    api('POST', '/api/predict', Object.assign(predictBody(lastBody, ans, x), {layers: true})).then(
      (p) => { if (last === ans) { layerBox.textContent = ''; layerBox.append(...layerView(p.layers)); } },
      (e) => { layerBox.lastChild.textContent = e.message; });
    // Mesh.
    const meshBox = h('section', {}, [h('h3', {text: 'Device mesh'}), h('p', {class: 'muted small', text: 'loading…'})]);
    d.append(meshBox);
    try {
      const gpn = (hardware[ans.hardware.name] || ans.hardware).per_node;
      // the layout's own groups: its rank order, experts, hybrid sharding's shard and replica groups and
      // the hierarchical form's all-to-all and ring groups (POST /api/mesh, as modelcut mesh lays them)
      const mesh = await api('POST', '/api/mesh', Object.assign({tp: x.tp, cp: x.cp, pp: x.pp, dp: x.dp, gpus_per_node: gpn},
                                                                x.order ? {order: x.order} : {},
                                                                x.ep > 1 ? {ep: x.ep, etp: x.etp} : {},
                                                                x.dp_shard ? {dp_shard: x.dp_shard} : {},
                                                                x.cp_a2a ? {cp_a2a: x.cp_a2a} : {}));
      if (last !== ans) return;
      renderMesh(meshBox, mesh);
    } catch (e) {
      meshBox.lastChild.textContent = e.message;
    }
  }

  /** A layout's recomputation, with the layers a chunk recomputes under the block method, or k of one layer in k. */
  function recomputeName(x) {
    const n = x.recompute_layers || x.recompute_every;
    return n ? `${x.recompute} ${n}` : x.recompute;
  }

  /** The POST /api/predict body of a ranked layout: the search's model and stack, the layout's knobs. */
  function predictBody(body, ans, x) {
    const out = {gpu: ans.hardware.name, framework: ans.framework, mode: ans.mode};
    if (body.hf_config) out.hf_config = body.hf_config; else out.model = body.model;
    const layout = {tp: x.tp, cp: x.cp, pp: x.pp, dp: x.dp, vpp: x.vpp, zero: x.zero, schedule: x.schedule,
                    order: x.order, sequence_parallel: x.sequence_parallel};
    if (x.ep > 1) Object.assign(layout, {ep: x.ep, etp: x.etp});
    if (x.cp > 1) layout.cp_kind = x.cp_kind;
    if (x.cp_a2a) layout.cp_a2a = x.cp_a2a;
    if (x.dp_shard) layout.dp_shard = x.dp_shard;
    if (x.last_layers) layout.last_layers = x.last_layers;
    const training = {seq_len: ans.seq, global_batch: ans.global_batch, micro_batch: x.micro_batch,
                      recompute: x.recompute_modules ? 'selective' : (x.recompute_layers || x.recompute_every) ? 'full' : x.recompute,
                      precision: ans.precision};
    if (x.recompute_modules) training.recompute_modules = x.recompute_modules;
    if (x.recompute_layers) training.recompute_layers = x.recompute_layers;
    if (x.recompute_every) training.recompute_every = x.recompute_every;
    if (ans.fp8_recipe) training.fp8_recipe = ans.fp8_recipe;
    if (ans.grad_reduce) training.grad_reduce = ans.grad_reduce;
    if (ans.attention) training.attention = ans.attention;
    if (x.local_batch) training.local_batch = x.local_batch;   // the layout's schedule runs, as searched
    return Object.assign(out, {layout, training});
  }

  /** Ask the server for the layout's predicted step as a Chrome trace and save it as a file. */
  async function downloadTrace(ans, x, btn) {
    btn.disabled = true;
    try {
      const trace = await api('POST', '/api/predict/trace', predictBody(lastBody, ans, x));
      const url = URL.createObjectURL(new Blob([JSON.stringify(trace)], {type: 'application/json'}));
      const a = h('a', {href: url, download: `modelcut-step-layout-${x.rank}.json`});
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    } catch (e) {
      showError(e.message);
    } finally {
      btn.disabled = false;
    }
  }

  /** A table bar that grows with its column (at least its drawn width). */
  function cell(svg) {
    svg.style.minWidth = svg.getAttribute('width') + 'px';
    return wide(svg, 'cellbar');
  }

  /** A bar that fills its column (stretched horizontally only). */
  function wide(svg, cls) {
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.removeAttribute('width');
    svg.classList.add(cls || 'wide');
    return svg;
  }

  function stageColumns(totals, capacity, limit) {
    const n = totals.length;
    const W = 420, H = 96, pad = 4;
    const bw = Math.max(2, Math.min(36, (W - pad * 2) / n - 3));
    const svg = s('svg', {viewBox: `0 0 ${W} ${H + 18}`, role: 'img', class: 'fill',
                          'aria-label': 'memory of each pipeline stage against the limit'});
    const y = (v) => H - v / capacity * (H - 18);
    totals.forEach((v, i) => {
      const x = pad + i * (bw + 3);
      const r = s('rect', {x, y: y(v), width: bw, height: H - y(v), fill: '#4a5a7a'});
      r.append(s('title', {text: `stage ${i}: ${gb(v)}`}));
      svg.append(r);
    });
    svg.append(s('line', {x1: 0, x2: W, y1: y(limit), y2: y(limit), stroke: LIMIT, 'stroke-width': 1.5}));
    svg.append(s('text', {x: W - 2, y: y(limit) - 3, 'text-anchor': 'end', 'font-size': 12, fill: '#1f2430',
                          text: `limit ${gb(limit)}`}));
    svg.append(s('text', {x: 2, y: H + 14, 'font-size': 12, fill: '#5b6170',
                          text: `each pipeline stage's device, stage 0 to ${n - 1}`}));
    return h('div', {class: 'chart'}, svg);
  }

  /** The mesh's groups beyond tp, cp, pp and dp, in words (modelcut mesh's names: cp_a2a, dp_shard, ...). */
  const MESH_DIM = {cp_a2a: 'cp all-to-all', cp_ring: 'cp ring', dp_shard: 'dp shard', dp_replica: 'dp replica'};
  const MESH_COORDS = ['etp', 'ep', 'edp', 'cp_a2a', 'cp_ring', 'dp_shard', 'dp_replica'];

  function renderMesh(box, m) {
    box.textContent = '';
    box.append(h('h3', {text: `Device mesh: ${fmt(m.world, 0)} GPUs in ${fmt(m.nodes, 0)} node${m.nodes === 1 ? '' : 's'} of ${m.gpus_per_node}, `
      + `rank order ${m.order.join(', ')} (innermost first)`}));
    const dims = h('div', {class: 'dims'});
    const where = {inside: 'inside a node', across: 'across nodes', mixed: 'partly across nodes'};
    for (const [dim, how] of Object.entries(m.dims)) {
      const g = m.groups.find((x) => x.dim === dim);
      dims.append(h('span', {class: `dim ${how}`, 'data-dim': dim,
                             text: `${MESH_DIM[dim] || dim} ${g ? g.size : ''}: ${where[how] || how}`}));
    }
    if (!Object.keys(m.dims).length) dims.append(h('span', {class: 'dim inside', text: 'one GPU: nothing to split'}));
    box.append(dims);
    box.append(h('p', {class: 'small muted', text: `Node ${m.node} holds ranks ${m.node_ranks[0].rank}–`
      + `${m.node_ranks[m.node_ranks.length - 1].rank}; each GPU's coordinates:`}));
    const node = h('div', {class: 'node', 'data-testid': 'mesh'});
    for (const r of m.node_ranks) {
      node.append(h('div', {class: 'gpu'}, [h('strong', {text: `GPU ${r.rank % m.gpus_per_node} · rank ${r.rank}`}),
        `tp ${r.tp} · cp ${r.cp}`, h('br'), `pp ${r.pp} · dp ${r.dp}`,
        ...MESH_COORDS.filter((k) => k in r).flatMap((k) => [h('br'), `${MESH_DIM[k] || k} ${r[k]}`])]));
    }
    box.append(node);
  }

  async function upload(file) {
    if (!file) return;
    showError('');
    const fd = new FormData();
    fd.append('file', file, file.name);
    try {
      const ans = await api('POST', '/api/upload-config', fd);
      hfConfig = ans.hf_config;
      let opt = $('model').querySelector(`option[value="${UPLOAD}"]`);
      if (!opt) { opt = h('option', {value: UPLOAD}); $('model').prepend(opt); }
      opt.textContent = `uploaded: ${ans.model.name} (${ans.model.layers} layers)`;
      $('model').value = UPLOAD;
      search();
    } catch (e) {
      showError(`${file.name}: ${e.message}`);
      $('config').value = '';
    }
  }

  async function start() {
    const st = readUrl();
    try {
      const cat = await api('GET', '/api/catalog');
      for (const m of cat.models) $('model').append(h('option', {value: m.name, text: m.name}));
      for (const hw of cat.hardware) {
        hardware[hw.name] = hw;
        $('gpu').append(h('option', {value: hw.name, text: `${hw.name} (${Math.round(hw.mem_bytes / 1e9)} GB)`}));
      }
      DEFAULTS.framework = cat.default_framework;
      if (!st.framework) st.framework = DEFAULTS.framework;
      for (const f of cat.frameworks) $('framework').append(h('option', {value: f, text: f}));
      // precisions, recipes and schedules as the API takes them (GET /api/catalog): the registry's
      // schedules, the ones the explorer searches by default checked
      for (const p of cat.precisions) $('precision').append(h('option', {value: p, text: p}));
      if (cat.precisions.includes('fp8')) {
        $('precision').append(h('option', {value: 'bf16,fp8', text: 'bf16 + fp8, side by side'}));
      }
      for (const g of cat.grad_reduce_dtypes || []) $('reduce').append(h('option', {value: g, text: g}));
      for (const k of cat.attention_kinds || []) $('attention').append(h('option', {value: k, text: k}));
      stackRecipes = cat.framework_fp8_recipes || {};
      // a link may name a stack as its users do (framework=torchtitan): the preset it names
      const alias = (cat.framework_aliases || {})[String(st.framework || '').toLowerCase()];
      if (alias) st.framework = alias;
      for (const sc of cat.schedules) {
        const box = h('input', {type: 'checkbox', name: 'schedule', value: sc.name});
        box.checked = sc.explored_by_default;
        $('schedules').append(h('label', {title: sc.doc}, [box, ` ${sc.name}`]));
      }
      // the forms of context parallelism, every one searched unless unchecked
      for (const k of cat.cp_kinds) {
        CP_FORM[k.name] = k.label;
        const box = h('input', {type: 'checkbox', name: 'cp_kind', value: k.name});
        box.checked = true;
        $('cp-kinds').append(h('label', {title: k.doc}, [box, ` ${k.label}`]));
      }
    } catch (e) { showError(`could not load the catalog: ${e.message}`); }
    if ([...$('model').options].some((o) => o.value === st.model)) $('model').value = st.model;
    const [gpu, cap] = String(st.gpu).split('@');   // a link may hold the GPU to a power limit: h100-sxm5-80gb@500w
    if ([...$('gpu').options].some((o) => o.value === gpu)) $('gpu').value = gpu;
    fitWatts();
    if (cap && !$('watts').disabled) $('watts').value = cap.replace(/w$/i, '');
    $('gpu').addEventListener('change', fitWatts);
    $('gpus').value = st.gpus; $('seq').value = st.seq; $('tokens').value = st.tokens; $('top').value = st.top;
    if ([...$('framework').options].some((o) => o.value === st.framework)) $('framework').value = st.framework;
    // the recipes the chosen stack's FP8 library runs (Transformer Engine's or torchao's), "the stack's" first
    const fillRecipes = () => {
      const keep = $('recipe').value;
      for (const o of [...$('recipe').options].slice(1)) o.remove();
      for (const r of stackRecipes[$('framework').value] || []) $('recipe').append(h('option', {value: r, text: r}));
      $('recipe').value = [...$('recipe').options].some((o) => o.value === keep) ? keep : '';
    };
    fillRecipes();
    $('framework').addEventListener('change', fillRecipes);
    if ([...$('precision').options].some((o) => o.value === st.precision)) $('precision').value = st.precision;
    if ([...$('recipe').options].some((o) => o.value === st.recipe)) $('recipe').value = st.recipe;
    if ([...$('reduce').options].some((o) => o.value === st.reduce)) $('reduce').value = st.reduce;
    if ([...$('attention').options].some((o) => o.value === st.attention)) $('attention').value = st.attention;
    $('local').value = st.local;
    const syncRecipe = () => { $('recipe').disabled = !$('precision').value.split(',').includes('fp8'); };
    syncRecipe();
    $('precision').addEventListener('change', syncRecipe);
    if (st.schedules) {
      for (const e of document.querySelectorAll('input[name=schedule]')) e.checked = st.schedules.includes(e.value);
    }
    if (st.cpKinds) {
      for (const e of document.querySelectorAll('input[name=cp_kind]')) e.checked = st.cpKinds.includes(e.value);
    }
    $('across').checked = st.across;
    $('search').addEventListener('submit', (e) => { e.preventDefault(); search(); });
    $('config').addEventListener('change', () => upload($('config').files[0]));
    search();
  }

  start();
})();
