// corral console: live parts of the page and deadline countdowns. Plain JavaScript, no
// library, no inline script (the console's Content-Security-Policy allows only this file).
//
// The page's live parts are elements with data-live="NAME". On every event of the daemon
// (the console's /console/stream), each is fetched again as a fragment of the same URL
// (header X-Corral-Fragment: NAME) and merged in: a child with data-key whose key and
// data-version are unchanged is kept as it is, so what someone is typing into an open
// decision's reason field survives a refresh. After each refresh <body data-seq> holds the
// seq of the last event the page has caught up with (for tests and the latency benchmark).
// The tabs of one browser share one stream (see listen).
(function () {
  "use strict";

  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function left(ms) {
    var s = Math.max(0, Math.floor(ms / 1000));
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return (h ? h + ":" + pad(m) : String(m)) + ":" + pad(s % 60);
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var due = Date.parse(el.getAttribute("data-deadline"));
      if (isNaN(due)) { return; }
      el.textContent = due <= now ? "deadline passed" : left(due - now) + " left";
    });
  }

  function merge(old, fresh) {
    var kept = new Map();
    Array.prototype.forEach.call(old.children, function (c) {
      if (c.dataset.key) { kept.set(c.dataset.key, c); }
    });
    var next = Array.prototype.map.call(fresh.children, function (c) {
      var o = c.dataset.key ? kept.get(c.dataset.key) : null;
      return o && o.dataset.version === c.dataset.version ? o : c;
    });
    old.replaceChildren.apply(old, next);
  }

  function start() {
    tick();
    setInterval(tick, 1000);
    var status = document.querySelector("[data-testid=live-status]");
    if (!document.querySelector("[data-live]") || !window.EventSource) { return; }
    var busy = false, dirty = false, wanted = 0;

    function load(region) {
      return fetch(location.pathname + location.search, {
        headers: { "X-Corral-Fragment": region.dataset.live },
        credentials: "same-origin",
        cache: "no-store"
      }).then(function (answer) {
        if (answer.status === 401) { location.reload(); return; }
        if (!answer.ok) { return; }
        return answer.text().then(function (html) {
          var t = document.createElement("template");
          t.innerHTML = html.trim();
          var fresh = t.content.firstElementChild;
          if (fresh) { merge(region, fresh); tick(); }
        });
      });
    }

    function refresh() {
      if (busy) { dirty = true; return; }
      busy = true;
      var upTo = wanted;
      var regions = Array.prototype.slice.call(document.querySelectorAll("[data-live]"));
      Promise.all(regions.map(load)).catch(function () {}).then(function () {
        document.body.dataset.seq = String(upTo);
        document.dispatchEvent(new CustomEvent("corral:updated", { detail: { seq: upTo } }));
        busy = false;
        if (dirty) { dirty = false; refresh(); }
      });
    }

    function hello(seq) {
      // The stream (re)opened: the page may have missed events before it, so it catches up.
      wanted = Math.max(wanted, seq);
      if (status) { status.textContent = "live"; }
      refresh();
    }
    function change(seq) {
      wanted = Math.max(wanted, seq);
      refresh();
    }
    function trouble(closed) {
      if (status) { status.textContent = "reconnecting"; }
      if (closed) { refresh(); }  // a session that ended answers 401: back to the login page
    }
    listen(hello, change, trouble);
  }

  function seqOf(e) { return Number(JSON.parse(e.data).seq) || 0; }

  function connect(hello, change, trouble) {
    var source = new EventSource("/console/stream");
    source.addEventListener("hello", function (e) { hello(seqOf(e)); });
    source.addEventListener("change", function (e) { change(seqOf(e)); });
    source.onerror = function () { trouble(source.readyState === EventSource.CLOSED); };
    return source;
  }

  // The tabs of one browser share one stream: a browser opens at most 6 connections to a
  // host over HTTP/1.1, so a stream per tab would leave a 7th tab unable to load. The tab
  // holding a Web Lock keeps the stream and passes what it says to the others on a
  // BroadcastChannel; when it closes, another tab takes the lock and opens the stream.
  function listen(hello, change, trouble) {
    if (!window.BroadcastChannel || !navigator.locks) { connect(hello, change, trouble); return; }
    var name = "corral-console-stream", channel = new BroadcastChannel(name);
    var leading = false, last = null;
    channel.onmessage = function (m) {
      var d = m.data || {};
      if (d.kind === "ask") {
        if (leading && last !== null) { channel.postMessage({ kind: "hello", seq: last }); }
      } else if (d.kind === "hello") { hello(Number(d.seq) || 0); }
      else if (d.kind === "change") { change(Number(d.seq) || 0); }
      else if (d.kind === "trouble") { trouble(Boolean(d.closed)); }
    };
    channel.postMessage({ kind: "ask" });  // a tab already holding the stream says hello
    navigator.locks.request(name, function () {
      leading = true;
      return new Promise(function (release) {
        var source = connect(function (seq) {
          last = seq;
          channel.postMessage({ kind: "hello", seq: seq });
          hello(seq);
        }, function (seq) {
          last = seq;
          channel.postMessage({ kind: "change", seq: seq });
          change(seq);
        }, function (closed) {
          channel.postMessage({ kind: "trouble", closed: closed });
          trouble(closed);
          if (closed) { leading = false; source.close(); release(); }
        });
      });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
