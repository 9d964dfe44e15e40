// nnk-lab: the book's chapters read in JupyterLab as they read on the book's pages.
//
// The chapters are written in MyST for Jupyter Book: their prose quotes computed numbers
// with {glue:text}`name:.3f`, cites with {cite}, refers with {ref}/{numref}/{doc}, and
// keeps notes in ```{note} blocks; figure captions live in the figure cell's metadata
// (mystnb.figure.caption). JupyterLab's own Markdown renderer shows all of that raw.
// This extension replaces the renderer of Markdown cells by one that first rewrites the
// MyST into plain Markdown:
//   * a glued name shows the value that the notebook's own outputs glued (the kernel's
//     "Run All" produces them), formatted with the role's Python format spec as myst-nb
//     does; before the chapter has run it shows the name in angle brackets;
//   * references read as text from book/lab/nnk-lab/static/references.json (written by
//     book/tools/lab_metadata.py): author-year citations, section titles, figure numbers;
//   * a {recorded}`[chapter/]name:spec` value (book/_ext/recorded.py) shows the value of the
//     chapter's largest record, from recorded.json beside it (written by the same tool),
//     formatted as a glued value, with a mark [profile] whose title says where it comes from;
//   * directives become block quotes with their title, and (label)= lines disappear;
// and it adds each figure's caption below its cell, and folds again after a run the
// outputs that the book hides (JupyterLab unfolds a cell's outputs when it runs it).
//
// It is a prebuilt JupyterLab 4 federated extension written by hand (no build step):
// this file is the webpack "remote entry" container that JupyterLab loads, and it takes
// the JupyterLab packages it needs from the shared scope that JupyterLab hands it.
// `make lab` puts book/lab on the extension path (LabApp.extra_labextensions_path).

/* eslint-disable no-var */
var _JUPYTERLAB = typeof window === 'undefined' ? {} : window._JUPYTERLAB || (window._JUPYTERLAB = {});

(function () {
  'use strict';

  var NAME = 'nnk-lab';
  var SCRIPT = typeof document !== 'undefined' && document.currentScript ? document.currentScript.src : '';
  var INDEX_URL = SCRIPT.replace(/[^/]*$/, 'references.json');
  var RECORDED_URL = SCRIPT.replace(/[^/]*$/, 'recorded.json');
  var NOT_RECORDED = '(not recorded)';
  var GLUE_MIME = 'application/papermill.record/text/plain';
  var shareScope = null;

  // ---- Python's format() for the values that myst-nb pastes -------------------------

  function pythonValue(text) {
    // The value of a glued text/plain repr, as myst-nb's literal_eval sees it: a string,
    // or {number, integer, text} for a number (text: the repr, which str() also gives).
    var t = String(text).trim();
    var q = /^(['"])([\s\S]*)\1$/.exec(t);
    if (q) {
      return q[2].replace(/\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)/g, function (_, e) {
        var c = e.charAt(0);
        if (c === 'x' || c === 'u' || c === 'U') return String.fromCodePoint(parseInt(e.slice(1), 16));
        return { n: '\n', t: '\t', r: '\r', '0': '\0' }[c] || e;
      });
    }
    if (/^[+-]?\d[\d_]*$/.test(t)) return { number: Number(t.replace(/_/g, '')), integer: true, text: t };
    if (/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(t)) return { number: Number(t), integer: false, text: t };
    if (t === 'True' || t === 'False') return { number: t === 'True' ? 1 : 0, integer: true, text: t };
    return t;
  }

  function toNumber(value) {
    // float(value) for a value that is not a Python number (a string such as 'inf').
    if (typeof value === 'object') return value.number;
    var s = String(value).trim();
    var np = /^np\.(?:float|int|uint)\d*\((.*)\)$/.exec(s); // numpy 2 scalar reprs
    if (np) s = np[1];
    s = s.toLowerCase();
    if (s === 'inf' || s === '+inf' || s === 'infinity') return Infinity;
    if (s === '-inf' || s === '-infinity') return -Infinity;
    if (s === 'nan') return NaN;
    var n = Number(s);
    if (s === '' || isNaN(n)) throw new Error('not a number: ' + value);
    return n;
  }

  function exactDecimal(a) {
    // The exact decimal expansion of a finite non-negative double: {digits, point}, with
    // value = 0.digits * 10^point (no leading or trailing zeros in digits; "" for zero).
    if (a === 0) return { digits: '', point: 0 };
    var view = new DataView(new ArrayBuffer(8));
    view.setFloat64(0, a);
    var hi = view.getUint32(0), lo = view.getUint32(4);
    var bits = (hi >>> 20) & 0x7ff;
    var mantissa = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
    var exp2 = bits === 0 ? -1074 : bits - 1075;
    if (bits !== 0) mantissa |= 1n << 52n;
    var digits, point;
    if (exp2 >= 0) {
      digits = (mantissa << BigInt(exp2)).toString();
      point = digits.length;
    } else { // m / 2^k = m * 5^k / 10^k
      digits = (mantissa * 5n ** BigInt(-exp2)).toString();
      point = digits.length + exp2;
    }
    return { digits: digits.replace(/0+$/, ''), point: point };
  }

  function roundDigits(d, keep) {
    // Round {digits, point} to its first `keep` digits, half to even as Python does.
    if (keep < 0) return { digits: '', point: d.point };
    if (d.digits.length <= keep) return d;
    var kept = d.digits.slice(0, keep);
    var rest = d.digits.slice(keep);
    var up = rest.charAt(0) > '5' || (rest.charAt(0) === '5' && (/[1-9]/.test(rest.slice(1)) ||
      (kept.length > 0 && Number(kept.charAt(kept.length - 1)) % 2 === 1)));
    if (!up) return { digits: kept, point: d.point };
    var carry = 1, out = '';
    for (var i = kept.length - 1; i >= 0; i--) {
      var v = Number(kept.charAt(i)) + carry;
      carry = v === 10 ? 1 : 0;
      out = String(v % 10) + out;
    }
    return carry ? { digits: ('1' + out).slice(0, Math.max(keep, 1)), point: d.point + 1 } : { digits: out, point: d.point };
  }

  function fixed(a, precision, shift) {
    // Python's format(a, '.{precision}f') for a finite a >= 0, of a * 10^shift.
    var d = exactDecimal(a);
    d = { digits: d.digits, point: d.point + (d.digits ? shift : 0) };
    d = roundDigits(d, d.point + precision);
    var digits = d.digits, point = d.point;
    if (point <= 0) { digits = '0'.repeat(1 - point) + digits; point = 1; }
    digits = digits + '0'.repeat(Math.max(0, point + precision - digits.length));
    var whole = digits.slice(0, point) || '0';
    var frac = digits.slice(point, point + precision);
    return precision > 0 ? whole + '.' + frac : whole;
  }

  function scientific(a, precision) {
    // [mantissa digits (precision + 1 of them), exponent] of Python's '.{precision}e'.
    if (a === 0) return ['0'.repeat(precision + 1), 0];
    var d = roundDigits(exactDecimal(a), precision + 1);
    return [d.digits + '0'.repeat(precision + 1 - d.digits.length), d.point - 1];
  }

  function exponential(a, precision, upper, alt) {
    var m = scientific(a, precision);
    var mantissa = m[0].charAt(0) + (precision > 0 || alt ? '.' : '') + m[0].slice(1);
    var exp = Math.abs(m[1]);
    return mantissa + (upper ? 'E' : 'e') + (m[1] < 0 ? '-' : '+') + (exp < 10 ? '0' : '') + exp;
  }

  function general(a, precision, alt, upper) {
    var p = precision === 0 ? 1 : precision;
    var exp = scientific(a, p - 1)[1];
    var s;
    if (exp >= -4 && exp < p) {
      s = fixed(a, Math.max(p - 1 - exp, 0), 0);
      if (!alt && s.indexOf('.') >= 0) s = s.replace(/0+$/, '').replace(/\.$/, '');
      if (alt && s.indexOf('.') < 0) s += '.';
    } else {
      s = exponential(a, p - 1, upper, alt);
      if (!alt) s = s.replace(/\.?0+(?=[eE])/, '');
    }
    return s;
  }

  function group(digits, sep) {
    return digits.replace(/\B(?=(\d{3})+(?!\d))/g, sep);
  }

  function formatPython(text, spec) {
    // myst-nb's format_plain_text: literal-eval the repr, then Python's format(value, spec).
    var value = pythonValue(text);
    var plain = typeof value === 'object' ? value.text : value;
    if (!spec) return plain;
    var m = /^(?:(.)?([<>=^]))?([+\- ]?)(#?)(0?)(\d*)([,_]?)(?:\.(\d+))?([bcdeEfFgGnosxX%]?)$/.exec(spec);
    if (!m) throw new Error('unsupported format spec: ' + spec);
    var fill = m[1] || (m[5] ? '0' : ' ');
    var align = m[2] || (m[5] ? '=' : '');
    var sign = m[3], alt = !!m[4], width = Number(m[6] || 0), sep = m[7];
    var precision = m[8] === undefined ? null : Number(m[8]);
    var type = m[9];
    var body, isNumber = true;
    if (type === 's' || (type === '' && typeof value !== 'object')) {
      body = String(plain);
      if (precision !== null) body = body.slice(0, precision);
      isNumber = false;
    } else {
      var x = toNumber(value);
      var integer = type === 'd' || (type === '' && value.integer);
      if (integer) x = Math.trunc(x) || 0; // int() of a float; no negative zero
      var negative = x < 0 || Object.is(x, -0);
      var a = Math.abs(x);
      if (!isFinite(a)) {
        body = isNaN(a) ? 'nan' : 'inf';
        if (type === '%') body += '%';
        if (type === 'E' || type === 'F' || type === 'G') body = body.toUpperCase();
      } else if (integer) {
        body = fixed(a, 0, 0);
      } else if (type === '') {
        body = String(plain).replace(/^[+-]/, '');
      } else if (type === 'f' || type === 'F') {
        body = fixed(a, precision === null ? 6 : precision, 0);
      } else if (type === 'e' || type === 'E') {
        body = exponential(a, precision === null ? 6 : precision, type === 'E', alt);
      } else if (type === '%') {
        // (Python multiplies the float by 100 first, rounding once there)
        body = fixed(a * 100, precision === null ? 6 : precision, 0) + '%';
      } else if (type === 'g' || type === 'G' || type === 'n') {
        body = general(a, precision === null ? 6 : precision, alt, type === 'G');
      } else {
        throw new Error('unsupported format type: ' + type);
      }
      if (sep && isFinite(a)) {
        var parts = /^(\d+)(.*)$/.exec(body);
        if (parts) body = group(parts[1], sep) + parts[2];
      }
      // Python keeps the sign of a negative float that rounds to zero ("-0.00").
      var signText = negative ? '-' : sign === '+' ? '+' : sign === ' ' ? ' ' : '';
      if (align === '=' && width > signText.length + body.length) {
        body = fill.repeat(width - signText.length - body.length) + body;
      }
      body = signText + body;
    }
    if (width > body.length) {
      var pad = width - body.length;
      var how = align || (isNumber ? '>' : '<');
      if (how === '<') body = body + fill.repeat(pad);
      else if (how === '^') body = fill.repeat(Math.floor(pad / 2)) + body + fill.repeat(Math.ceil(pad / 2));
      else if (how === '>') body = fill.repeat(pad) + body;
    }
    return body;
  }

  // ---- MyST to plain Markdown --------------------------------------------------------

  function escapeMarkdown(text) {
    return String(text).replace(/([\\`*_[\]<>#|$])/g, '\\$1');
  }

  function escapeHtml(text) {
    return String(text).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
  }

  function chapterOf(path) {
    // "chapters/02_random_features.ipynb" -> "02_random_features"
    return path ? String(path).replace(/^.*\//, '').replace(/\.ipynb$/, '') : null;
  }

  function recordedRole(content, state) {
    // {recorded}`[chapter/]name[:spec]`: as book/_ext/recorded.py's split_target reads it.
    var colon = content.indexOf(':');
    var where = colon >= 0 ? content.slice(0, colon) : content;
    var spec = colon >= 0 ? content.slice(colon + 1).trim() : '';
    var slash = where.lastIndexOf('/');
    var name = where.slice(slash + 1).trim();
    var records = state.recorded || {};
    var chapter = slash >= 0 ? where.slice(0, slash).trim() : state.chapter;
    if (!(chapter in records) && slash < 0 && name.charAt(0) !== '@') {
      // the notebook's own chapter is not known: the chapter whose record has the name
      chapter = Object.keys(records).filter(function (c) { return name in records[c].values; })[0];
    }
    var record = records[chapter];
    var table = record && (name.charAt(0) === '@' ? record.facts : record.values);
    var key = name.charAt(0) === '@' ? name.slice(1) : name;
    if (!table || !(key in table)) return escapeMarkdown(NOT_RECORDED);
    var text;
    try {
      text = formatPython(table[key], spec);
    } catch (err) {
      text = String(pythonValue(table[key]).text || table[key]);
    }
    var profile = pythonValue(record.facts.profile || "'record'");
    return escapeMarkdown(text) + '<sup class="nnk-lab-recorded" title="' + escapeHtml(record.title) + '">[' +
      escapeHtml(typeof profile === 'object' ? profile.text : profile) + ']</sup>';
  }

  function target(content) {
    // "text <label>" or "label"
    var m = /^([\s\S]*?)\s*<([^<>]+)>\s*$/.exec(content);
    return m ? { text: m[1], label: m[2].trim() } : { text: null, label: content.trim() };
  }

  function role(name, content, state) {
    var index = state.index;
    if (name === 'glue:text' || name === 'glue') {
      var colon = content.lastIndexOf(':');
      var key = colon >= 0 ? content.slice(0, colon) : content;
      var spec = colon >= 0 ? content.slice(colon + 1) : '';
      if (!(key in state.values)) {
        state.pending += 1;
        return '⟨' + escapeMarkdown(key) + '⟩';
      }
      try {
        return escapeMarkdown(formatPython(state.values[key], spec));
      } catch (err) {
        return escapeMarkdown(state.values[key]);
      }
    }
    if (name === 'recorded') return recordedRole(content, state);
    if (name === 'cite' || name === 'cite:p' || name === 'cite:t') {
      var keys = content.split(',').map(function (k) { return k.trim(); });
      var texts = keys.map(function (k) { return (index.cite && index.cite[k]) || k; });
      return '\\[' + escapeMarkdown(texts.join('; ')) + '\\]';
    }
    var t = target(content);
    if (name === 'numref') {
      var number = (index.numref && index.numref[t.label]) || t.label;
      if (t.text) return escapeMarkdown(t.text.replace(/\{number\}|%s/g, number.replace(/^Figure /, '')));
      return escapeMarkdown(number);
    }
    if (name === 'ref' || name === 'doc') {
      var table = name === 'ref' ? index.ref : index.doc;
      var label = name === 'doc' ? t.label.replace(/^.*\//, '').replace(/\.(md|ipynb)$/, '') : t.label;
      var title = t.text || (table && table[label]) || label;
      return /^Figure \d/.test(title) ? escapeMarkdown(title) : '*' + escapeMarkdown(title) + '*';
    }
    if (name === 'eq') return '(' + escapeMarkdown(content) + ')';
    if (name === 'math') return '$' + content + '$';
    return '`' + content + '`';
  }

  function glueNames(source) {
    var names = [];
    source.replace(/\{glue(?::text)?\}`([^`]*)`/g, function (_, content) {
      var colon = content.lastIndexOf(':');
      names.push(colon >= 0 ? content.slice(0, colon) : content);
      return '';
    });
    return names;
  }

  function roles(line, state) {
    return line.replace(/\{([a-z][a-z:-]*)\}`([^`]*)`/g, function (_, name, content) {
      return role(name, content, state);
    });
  }

  var DIRECTIVE = /^(\s*)(`{3,}|:{3,})\{([a-zA-Z][\w:-]*)\}\s*(.*)$/;
  var FENCE = /^(\s*)(`{3,}|~{3,})/;

  function titleOf(kind, argument) {
    if (kind === 'admonition') return argument || 'Note';
    var name = kind.charAt(0).toUpperCase() + kind.slice(1);
    return argument ? name + ': ' + argument : name;
  }

  function guessChapter(source, records) {
    // The chapter whose record has a name that the text's {recorded} roles quote without a
    // chapter (each chapter's names have their own prefix); null when none does.
    var found = null;
    source.replace(/\{recorded\}`([^`/:@]+)[:`]/g, function (_, name) {
      if (found === null) {
        found = Object.keys(records || {}).filter(function (c) { return name.trim() in records[c].values; })[0] || null;
      }
      return '';
    });
    return found;
  }

  function mystToMarkdown(source, state) {
    if (!state.chapter && state.recorded) state.chapter = guessChapter(source, state.recorded);
    var out = [];
    var lines = source.split('\n');
    var stack = []; // open directives: {fence, prefix, kind}
    var code = null; // an open plain code fence inside which nothing is rewritten
    var prefix = function () { return stack.map(function (d) { return d.quote; }).join(''); };
    for (var i = 0; i < lines.length; i++) {
      var line = lines[i];
      if (code) {
        out.push(prefix() + line);
        var close = FENCE.exec(line);
        if (close && close[2].charAt(0) === code.charAt(0) && close[2].length >= code.length &&
            line.trim() === close[2]) code = null;
        continue;
      }
      var top = stack[stack.length - 1];
      if (top && line.trim() === top.fence) {
        stack.pop();
        out.push(prefix());
        continue;
      }
      var d = DIRECTIVE.exec(line);
      if (d) {
        var kind = d[3];
        var argument = roles(d[4], state);
        if (kind === 'math') {
          var body = [];
          for (i += 1; i < lines.length && lines[i].trim() !== d[2]; i++) {
            if (!/^:[\w-]+:/.test(lines[i].trim())) body.push(lines[i]);
          }
          out.push(prefix() + '$$', body.map(function (b) { return prefix() + b; }).join('\n'), prefix() + '$$');
          continue;
        }
        out.push(prefix() + '> **' + titleOf(kind, argument) + '**', prefix() + '>');
        stack.push({ fence: d[2], quote: '> ' });
        while (i + 1 < lines.length && /^\s*:[\w-]+:/.test(lines[i + 1])) i += 1; // options
        continue;
      }
      var f = FENCE.exec(line);
      if (f) {
        code = f[2];
        out.push(prefix() + line);
        continue;
      }
      if (/^\s*\([^()\s]+\)=\s*$/.test(line)) continue; // (label)= targets
      line = line.replace(/(\$\$)\s*\([^()\s]+\)\s*$/, '$1'); // $$ (eq-label)
      out.push(prefix() + roles(line, state));
    }
    return out.join('\n');
  }

  // ---- JupyterLab side -----------------------------------------------------------------

  function shared(pkg) {
    var versions = shareScope && shareScope[pkg];
    if (!versions) return Promise.reject(new Error(NAME + ': JupyterLab does not share ' + pkg));
    var best = Object.keys(versions).sort(function (a, b) {
      var pa = a.split(/[.-]/).map(Number), pb = b.split(/[.-]/).map(Number);
      for (var k = 0; k < 3; k++) if ((pa[k] || 0) !== (pb[k] || 0)) return (pa[k] || 0) - (pb[k] || 0);
      return 0;
    }).pop();
    return Promise.resolve(versions[best].get()).then(function (factory) { return factory(); });
  }

  function metadataOf(model, key) {
    if (typeof model.getMetadata === 'function') return model.getMetadata(key);
    return model.metadata && (model.metadata.get ? model.metadata.get(key) : model.metadata[key]);
  }

  function gluedValues(notebookModel) {
    var values = {};
    var cells = notebookModel.cells;
    for (var i = 0; i < cells.length; i++) {
      var cell = cells.get(i);
      if (cell.type !== 'code' || !cell.outputs) continue;
      for (var j = 0; j < cell.outputs.length; j++) {
        var output = cell.outputs.get(j);
        var meta = output.metadata && output.metadata.scrapbook;
        if (!meta || !meta.name) continue;
        var data = output.data || {};
        var text = data[(meta.mime_prefix || '') + 'text/plain'];
        if (text === undefined) text = data[GLUE_MIME];
        if (text !== undefined) values[meta.name] = Array.isArray(text) ? text.join('') : String(text);
      }
    }
    return values;
  }

  function makePlugin(rendermimeModule, notebookModule) {
    var tracker = null;
    var index = {};
    var recorded = {};
    var values = {};
    var renderers = new Set();

    var style = document.createElement('style');
    style.textContent = [
      '.nnk-lab-caption { margin: 0.2em 0 1em var(--jp-cell-prompt-width, 64px); padding: 0 1em;',
      '  color: var(--jp-ui-font-color1); font-size: var(--jp-content-font-size1); }',
      '.nnk-lab-caption p { margin: 0.3em 0; }'
    ].join('\n');
    document.head.appendChild(style);

    class BookMarkdown extends rendermimeModule.RenderedMarkdown {
      constructor(options) {
        super(options);
        this.nnkResolver = options.resolver; // in a notebook: knows the notebook's path
      }

      render(model) {
        this.nnkModel = model;
        renderers.add(this);
        var source = String(model.data['text/markdown'] || '');
        var path = this.nnkResolver && this.nnkResolver.path;
        if (!path && tracker && tracker.currentWidget && tracker.currentWidget.context) {
          path = tracker.currentWidget.context.path;
        }
        var state = { values: values, index: index, recorded: recorded, chapter: chapterOf(path), pending: 0 };
        var text = mystToMarkdown(source, state);
        this.nnkGlued = glueNames(source);
        this.node.dataset.nnkPending = String(state.pending);
        return super.render({
          data: Object.assign({}, model.data, { 'text/markdown': text }),
          metadata: model.metadata,
          trusted: model.trusted,
          setData: function () {}
        });
      }

      dispose() {
        renderers.delete(this);
        super.dispose();
      }
    }

    function rerender(changed) {
      // Render again every live renderer (changed: null), or those quoting a changed name.
      renderers.forEach(function (r) {
        if (r.isDisposed) { renderers.delete(r); return; }
        var affected = changed === null || r.nnkGlued.some(function (name) { return changed.has(name); });
        if (affected && r.nnkModel) void r.renderModel(r.nnkModel);
      });
    }

    function addCaptions(panel) {
      var notebook = panel.content;
      if (!notebook || !notebook.widgets) return;
      notebook.widgets.forEach(function (cell) {
        if (!cell.model || cell.model.type !== 'code') return;
        var mystnb = metadataOf(cell.model, 'mystnb') || {};
        var figure = mystnb.figure || {};
        var existing = cell.node.querySelector(':scope > .nnk-lab-caption');
        if (!figure.caption) { if (existing) existing.remove(); return; }
        var number = (index.numref && index.numref[figure.name]) || 'Figure';
        var source = '**' + number + '.** ' + figure.caption;
        if (existing && existing.dataset.source === source) return;
        if (existing) existing.remove();
        var box = document.createElement('div');
        box.className = 'nnk-lab-caption';
        box.dataset.source = source;
        box.dataset.figure = figure.name || '';
        var renderer = notebook.rendermime.createRenderer('text/markdown');
        box.appendChild(renderer.node);
        cell.node.appendChild(box);
        // (a renderer that is not an attached widget does not typeset its math itself)
        void renderer.renderModel(new rendermimeModule.MimeModel({
          data: { 'text/markdown': source }, trusted: true
        })).then(function () {
          if (notebook.rendermime.latexTypesetter) notebook.rendermime.latexTypesetter.typeset(renderer.node);
        });
      });
    }

    return {
      id: NAME + ':prose',
      description: "Renders the book's MyST roles, notes and figure captions in notebooks.",
      autoStart: true,
      requires: [rendermimeModule.IRenderMimeRegistry, notebookModule.INotebookTracker],
      activate: function (app, registry, notebooks) {
        tracker = notebooks;
        registry.addFactory({
          safe: true,
          mimeTypes: ['text/markdown'],
          defaultRank: 60,
          createRenderer: function (options) { return new BookMarkdown(options); }
        }, 60);

        function load(url) {
          return fetch(url).then(function (r) { return r.ok ? r.json() : {}; }).catch(function () { return {}; });
        }
        Promise.all([load(INDEX_URL), load(RECORDED_URL)]).then(function (data) {
          index = data[0] || {};
          recorded = data[1] || {};
          rerender(null);
          tracker.forEach(addCaptions);
        });

        var signature = '';
        function refresh() {
          var merged = {};
          tracker.forEach(function (panel) {
            if (panel.content && panel.content.model) Object.assign(merged, gluedValues(panel.content.model));
            addCaptions(panel);
          });
          var next = JSON.stringify(merged);
          if (next !== signature) {
            var changed = new Set();
            Object.keys(merged).concat(Object.keys(values)).forEach(function (name) {
              if (merged[name] !== values[name]) changed.add(name);
            });
            signature = next;
            values = merged;
            rerender(changed);
          }
        }
        window.setInterval(refresh, 1000);

        // JupyterLab shows a cell's outputs again whenever it runs the cell; fold them
        // again when the book hides them (the reader can still unfold them).
        var hideOutput = ['hide-output', 'remove-output', 'hide-cell', 'remove-cell'];
        notebookModule.NotebookActions.executed.connect(function (_, args) {
          var cell = args.cell;
          var tags = (cell && cell.model && metadataOf(cell.model, 'tags')) || [];
          if (cell.model.type === 'code' && tags.some(function (t) { return hideOutput.indexOf(t) >= 0; })) {
            cell.outputHidden = true;
          }
        });
        tracker.widgetAdded.connect(function (_, panel) {
          panel.context.ready.then(refresh);
        });
      }
    };
  }

  _JUPYTERLAB[NAME] = {
    init: function (scope) { shareScope = scope; },
    get: function (module) {
      if (module !== './extension') return Promise.reject(new Error(NAME + ': no module ' + module));
      return Promise.all([shared('@jupyterlab/rendermime'), shared('@jupyterlab/notebook')])
        .then(function (modules) {
          var plugin = makePlugin(modules[0], modules[1]);
          return function () { return { __esModule: true, default: [plugin] }; };
        });
    }
  };

  // For tests (node): the pure parts.
  if (typeof module !== 'undefined' && module.exports) {
    module.exports = { formatPython: formatPython, mystToMarkdown: mystToMarkdown, pythonValue: pythonValue };
  }
})();
