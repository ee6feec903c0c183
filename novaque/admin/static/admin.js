// novaque admin: live refresh, trend charts (per day, and the last hour per
// minute), consumers online and POST actions.
// Everything from the server is inserted with textContent or as escaped HTML
// rendered by the server; nothing here builds HTML from data.
(function () {
  "use strict";

  var meta = function (name) {
    var el = document.querySelector('meta[name="' + name + '"]');
    return el ? el.getAttribute("content") : "";
  };
  var CSRF = meta("novaque-csrf");
  var REFRESH_MS = 3000;
  var LIVE_CHART_MS = 10000;

  function flash(text, kind) {
    var box = document.getElementById("flash");
    if (!box) return;
    box.textContent = text;
    box.className = "flash " + (kind || "ok");
    box.hidden = false;
    clearTimeout(flash.timer);
    flash.timer = setTimeout(function () { box.hidden = true; }, 6000);
  }

  function request(method, url, payload) {
    var options = { method: method, credentials: "same-origin", headers: { Accept: "application/json" } };
    if (method === "POST") {
      options.headers["Content-Type"] = "application/json";
      options.headers["X-CSRF-Token"] = CSRF;
      options.body = JSON.stringify(payload || {});
    }
    return fetch(url, options).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) {
          throw new Error(data.error || response.status + " " + response.statusText);
        }
        return data;
      });
    });
  }

  // A number and the noun that goes with it: "1 dead letter", "2 dead letters"
  // (the command line's words).
  function count(number, one, many) {
    return number + " " + (number === 1 ? one : many);
  }

  // What an action did, in a sentence, from the API's answer.
  function describe(data) {
    if (data.id !== undefined) return "Published message " + data.id + ".";
    if (data.requeued !== undefined) {
      return "Requeued " + count(data.requeued, "dead letter", "dead letters") + ".";
    }
    if (data.deleted !== undefined && typeof data.deleted === "number") {
      return "Deleted " + count(data.deleted, "dead letter", "dead letters") + ".";
    }
    if (data.deleted) return "Deleted.";
    if (data.replayed !== undefined) {
      return "Replayed: " + count(data.replayed, "delivery", "deliveries") + " created.";
    }
    if (data.cancelled !== undefined) {
      return "Cancelled " +
        count(data.cancelled, "never-attempted delivery", "never-attempted deliveries") + ".";
    }
    if (data.channel) return "Channel " + data.channel + " is ready.";
    if (data.topic) return "Topic " + data.topic + " is ready.";
    return "Done.";
  }

  function after(el, data) {
    var then = el.getAttribute("data-then");
    flash(describe(data), "ok");
    if (then) {
      window.location.assign(then);
    } else {
      setTimeout(function () { window.location.reload(); }, 400);
    }
  }

  function checkedValues(selector) {
    return Array.prototype.map.call(document.querySelectorAll(selector + ":checked"), function (box) {
      return box.value;
    });
  }

  // -- buttons that POST --------------------------------------------------------------
  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!(target instanceof Element)) return;
    if (target.id === "pick-all") {
      Array.prototype.forEach.call(document.querySelectorAll("input.pick"), function (box) {
        box.checked = target.checked;
      });
      return;
    }
    var button = target.closest("[data-post]");
    if (!button) return;
    event.preventDefault();
    var payload = {};
    if (button.hasAttribute("data-payload")) payload = JSON.parse(button.getAttribute("data-payload"));
    if (button.hasAttribute("data-selected")) {
      var ids = checkedValues("input.pick").map(Number);
      if (!ids.length) { flash("Select at least one dead letter first.", "error"); return; }
      payload.ids = ids;
    }
    if (button.hasAttribute("data-selected-channels")) {
      var channels = checkedValues("input.pick-channel");
      if (!channels.length) { flash("Select at least one channel first.", "error"); return; }
      payload.channels = channels;
    }
    var question = button.getAttribute("data-confirm");
    if (question && !window.confirm(question)) return;
    button.disabled = true;
    request("POST", button.getAttribute("data-post"), payload)
      .then(function (data) { after(button, data); })
      .catch(function (error) { flash(error.message, "error"); })
      .then(function () { button.disabled = false; });
  });

  // -- forms ------------------------------------------------------------------------
  function utc(value) {
    return value ? value + (value.length === 16 ? ":00" : "") + "Z" : null;
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    var url, payload;
    if (form.hasAttribute("data-create")) {
      url = form.getAttribute("data-create");
      payload = { name: form.elements.name.value.trim() };
    } else if (form.hasAttribute("data-publish")) {
      url = form.getAttribute("data-publish");
      payload = { body: form.elements.body.value };
      if (form.elements.delay.value) payload.delay = Number(form.elements.delay.value);
    } else if (form.hasAttribute("data-redrive")) {
      url = form.getAttribute("data-redrive");
      payload = { all: true };
      var target = form.elements.to_channel.value;
      var limit = form.elements.limit.value;
      if (target) payload.to_channel = target;
      if (limit) payload.limit = Number(limit);
      var here = form.getAttribute("data-topic-name") + "/" + form.getAttribute("data-channel-name");
      var chosen = limit
        ? "the " + (Number(limit) === 1 ? "dead letter that died" : limit + " dead letters that died") + " first"
        : "every dead letter";
      var question = "Requeue " + chosen + " of " + here + (target ? " into channel " + target : "") + "?";
      if (!window.confirm(question)) { event.preventDefault(); return; }
    } else if (form.hasAttribute("data-replay-range")) {
      url = form.getAttribute("data-replay-range");
      payload = {
        since: utc(form.elements.since.value),
        until: utc(form.elements.until.value),
        channels: Array.prototype.filter.call(form.querySelectorAll('input[name="channel"]'), function (b) {
          return b.checked;
        }).map(function (b) { return b.value; })
      };
    } else {
      return;
    }
    event.preventDefault();
    request("POST", url, payload)
      .then(function (data) {
        if (form.hasAttribute("data-publish")) {
          flash(describe(data), "ok");
          form.reset();
          refresh();
        } else {
          after(form, data);
        }
      })
      .catch(function (error) { flash(error.message, "error"); });
  });

  // -- live refresh ---------------------------------------------------------------------
  function sections(container) {
    if (container.hasAttribute("data-topic")) return [container];
    return Array.prototype.slice.call(container.querySelectorAll("[data-topic]"));
  }

  function shapeOf(container) {
    return sections(container).map(function (section) {
      var rows = Array.prototype.map.call(section.querySelectorAll("tr[data-channel]"), function (row) {
        var dead = row.querySelector('[data-field="backlog.dead"]');
        return row.getAttribute("data-channel") + (dead && dead.textContent !== "0" ? "+" : "");
      });
      return section.getAttribute("data-topic") + ":" + rows.join(",");
    }).join("|");
  }

  function shapeOfData(data, only) {
    return data.topics.filter(function (t) { return !only || t.name === only; }).map(function (t) {
      return t.name + ":" + t.channels.map(function (c) {
        return c.name + (c.backlog.dead ? "+" : "");
      }).join(",");
    }).join("|");
  }

  // How long something waited, as the server writes it (_pages.age).
  function age(seconds) {
    if (seconds === null || seconds === undefined) return "\u2014";
    var total = Math.floor(seconds);
    var days = Math.floor(total / 86400), hours = Math.floor((total % 86400) / 3600);
    var minutes = Math.floor((total % 3600) / 60), secs = total % 60;
    if (days) return days + " d " + hours + " h";
    if (hours) return hours + " h " + minutes + " min";
    if (minutes) return minutes + " min " + secs + " s";
    return secs + " s";
  }

  function fill(scope, values) {
    Array.prototype.forEach.call(scope.querySelectorAll("[data-field]"), function (cell) {
      var path = cell.getAttribute("data-field").split(".");
      var value = values;
      for (var i = 0; i < path.length && value !== undefined && value !== null; i++) value = value[path[i]];
      if (value === undefined) return;
      var text = cell.getAttribute("data-format") === "age" ? age(value) : String(value);
      if (cell.textContent !== text) {
        cell.textContent = text;
        cell.classList.add("changed");
        setTimeout(function () { cell.classList.remove("changed"); }, 900);
      }
    });
  }

  function stamp() {
    var live = document.getElementById("live");
    if (live) live.textContent = "live · updated " + new Date().toLocaleTimeString();
  }

  function swapFromServer(container) {
    return fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) { return response.text(); })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById(container.id);
        if (fresh) container.replaceChildren.apply(container, Array.prototype.slice.call(fresh.childNodes));
      });
  }

  var busy = false;
  function refresh() {
    if (busy || document.hidden) return;
    var container = document.querySelector("[data-refresh]");
    var channelStats = document.querySelector("[data-refresh-channel]");
    var work = null;
    if (container) {
      var single = document.body.getAttribute("data-page") === "topic"
        ? container.getAttribute("data-topic") : null;
      work = request("GET", container.getAttribute("data-refresh")).then(function (data) {
        if (!data.topics) data = { topics: [data] };  // one topic's answer
        var totals = document.querySelector("[data-totals]");
        if (totals && data.consumers !== undefined) fill(totals, data);
        if (shapeOfData(data, single) !== shapeOf(container)) return swapFromServer(container);
        data.topics.forEach(function (topic) {
          sections(container).forEach(function (section) {
            if (section.getAttribute("data-topic") !== topic.name) return;
            topic.channels.forEach(function (channel) {
              Array.prototype.forEach.call(section.querySelectorAll("tr[data-channel]"), function (row) {
                if (row.getAttribute("data-channel") === channel.name) fill(row, channel);
              });
            });
          });
        });
      });
    } else if (channelStats) {
      work = request("GET", channelStats.getAttribute("data-refresh-channel")).then(function (data) {
        fill(channelStats, data);
        fillConsumers(data.consumers);
      });
    }
    if (!work) return;
    busy = true;
    work.then(stamp).catch(function (error) {
      var live = document.getElementById("live");
      if (live) live.textContent = "refresh failed: " + error.message;
    }).then(function () { busy = false; });
  }

  // -- trend chart (inline SVG) ---------------------------------------------------------
  var SERIES = [
    { key: "published", label: "published", color: "#2563eb" },
    { key: "acked", label: "acked", color: "#16a34a" },
    { key: "requeued", label: "requeued", color: "#d97706" },
    { key: "dead", label: "dead", color: "#dc2626" }
  ];
  var SVG = "http://www.w3.org/2000/svg";

  function svg(name, attrs, parent) {
    var el = document.createElementNS(SVG, name);
    Object.keys(attrs || {}).forEach(function (k) { el.setAttribute(k, String(attrs[k])); });
    if (parent) parent.appendChild(el);
    return el;
  }

  function days(since, until) {
    var out = [];
    var d = new Date(since + "T00:00:00Z");
    var end = new Date(until + "T00:00:00Z");
    while (d <= end && out.length < 400) {
      out.push(d.toISOString().slice(0, 10));
      d = new Date(d.getTime() + 86400000);
    }
    return out;
  }

  function niceMax(value) {
    if (value <= 4) return 4;
    var power = Math.pow(10, Math.floor(Math.log10(value)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * power >= value) return steps[i] * power;
    return 10 * power;
  }

  function drawChart(box, data) {
    var byDay = {};
    data.days.forEach(function (row) { byDay[row.day] = row; });
    drawLines(box, days(data.since, data.until), byDay,
      "Daily counters of " + data.topic + "/" + data.channel,
      function (day) { return day.slice(5); });
  }

  // The last hour: the server lists every minute (zeros too), oldest first.
  // The page names what is counted (deliveries) in the box's data-title.
  function drawMinutes(box, data) {
    var byMinute = {};
    var labels = data.minutes.map(function (row) { byMinute[row.minute] = row; return row.minute; });
    drawLines(box, labels, byMinute, box.getAttribute("data-title"),
      function (minute) { return minute.slice(11, 16); });
  }

  // One line per SERIES over ``labels``; ``rows[label]`` holds the values.
  function drawLines(box, labels, rows, title, tick) {
    var byDay = rows;
    var W = 820, H = 260, L = 56, R = 16, T = 16, B = 40;
    var top = 0;
    labels.forEach(function (day) {
      SERIES.forEach(function (s) { top = Math.max(top, (byDay[day] || {})[s.key] || 0); });
    });
    var max = niceMax(top);
    var x = function (i) { return L + (labels.length === 1 ? (W - L - R) / 2 : i * (W - L - R) / (labels.length - 1)); };
    var y = function (v) { return T + (H - T - B) * (1 - v / max); };
    var root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", class: "trend" });
    svg("title", {}, root).textContent = title;
    for (var g = 0; g <= 4; g++) {
      var v = (max * g) / 4;
      svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }, root);
      var t = svg("text", { x: L - 8, y: y(v) + 4, "text-anchor": "end", class: "axis" }, root);
      t.textContent = String(Math.round(v));
    }
    var every = Math.max(1, Math.ceil(labels.length / 8));
    var lastShown = labels.length - 1 - ((labels.length - 1) % every);
    labels.forEach(function (day, i) {
      var isLast = i === labels.length - 1;
      if (i % every !== 0 && !(isLast && i - lastShown >= every / 2)) return;
      var t = svg("text", { x: x(i), y: H - B + 18, "text-anchor": "middle", class: "axis" }, root);
      t.textContent = tick(day);
    });
    SERIES.forEach(function (s) {
      var points = labels.map(function (day, i) {
        return x(i).toFixed(1) + "," + y((byDay[day] || {})[s.key] || 0).toFixed(1);
      });
      svg("polyline", { points: points.join(" "), fill: "none", stroke: s.color, "stroke-width": 2, class: "series s-" + s.key }, root);
      labels.forEach(function (day, i) {
        var value = (byDay[day] || {})[s.key] || 0;
        if (!value) return;
        var dot = svg("circle", { cx: x(i), cy: y(value), r: 3.5, fill: s.color }, root);
        svg("title", {}, dot).textContent = tick(day) + " " + s.label + ": " + value;
      });
    });
    var legend = document.createElement("div");
    legend.className = "legend";
    SERIES.forEach(function (s) {
      var item = document.createElement("span");
      var swatch = document.createElement("i");
      swatch.style.background = s.color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(" " + s.label));
      legend.appendChild(item);
    });
    box.replaceChildren(root, legend);
  }

  function chart() {
    var box = document.getElementById("chart");
    if (!box) return;
    var url = box.getAttribute("data-daily") + "?since=" + encodeURIComponent(box.getAttribute("data-since")) +
      "&until=" + encodeURIComponent(box.getAttribute("data-until"));
    request("GET", url).then(function (data) { drawChart(box, data); }).catch(function (error) {
      box.textContent = "chart unavailable: " + error.message;
    });
  }

  function liveChart() {
    var box = document.getElementById("live-chart");
    if (!box || document.hidden) return;
    request("GET", box.getAttribute("data-minutes")).then(function (data) {
      drawMinutes(box, data);
    }).catch(function (error) {
      box.textContent = "chart unavailable: " + error.message;
    });
  }

  // -- consumers online (channel page): rows rebuilt with textContent -------------------
  function when(text) { return text ? text.slice(0, 19).replace("T", " ") : ""; }

  function fillConsumers(found) {
    var table = document.getElementById("consumers");
    if (!table || !found) return;
    var body = table.querySelector("tbody");
    var rows = found.map(function (c) {
      var row = document.createElement("tr");
      [c.host, c.pid, c.in_flight + " / " + c.max_in_flight, when(c.started_at), when(c.heartbeat_at)]
        .forEach(function (value, i) {
          var cell = document.createElement("td");
          if (i === 1 || i === 2) cell.className = "num";
          cell.textContent = String(value);
          row.appendChild(cell);
        });
      return row;
    });
    body.replaceChildren.apply(body, rows);
    var note = table.parentNode.querySelector(".empty-note");
    if (note) note.hidden = found.length > 0;
    var count = table.parentNode.querySelector('[data-field="consumer_count"]');
    if (count) count.textContent = String(found.length);
  }

  document.addEventListener("DOMContentLoaded", function () {
    chart();
    liveChart();
    if (document.getElementById("live-chart")) setInterval(liveChart, LIVE_CHART_MS);
    if (document.querySelector("[data-refresh], [data-refresh-channel]")) {
      stamp();
      setInterval(refresh, REFRESH_MS);
    }
  });
  window.novaqueRefresh = refresh;
})();
