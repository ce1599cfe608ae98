// halfmq dashboard: charts (uPlot) fed by the JSON API, confirmations for destructive forms. No build step.
"use strict";

function csrfToken() {
  return document.querySelector('meta[name="csrf-token"]').content;
}

// A chart per element with data-series-url: the URL answers {name: {series: [[unix ms, value], ...]}}, and
// data-series picks which series of each name is drawn (one line per name). Redrawn every 5 s.
function drawChart(el) {
  const url = el.dataset.seriesUrl, key = el.dataset.series;
  let plot = null;
  async function refresh() {
    let data;
    try {
      const resp = await fetch(url, {headers: {"Accept": "application/json"}});
      if (!resp.ok) return;
      data = await resp.json();
    } catch (e) { return; }
    const names = Object.keys(data).sort();
    const times = new Set();
    for (const n of names) for (const [t] of (key ? data[n][key] : data[n]) || []) times.add(t);
    const xs = Array.from(times).sort((a, b) => a - b);
    const columns = [xs.map(t => t / 1000)];
    for (const n of names) {
      const byTime = new Map((key ? data[n][key] : data[n]) || []);
      columns.push(xs.map(t => byTime.has(t) ? byTime.get(t) : null));
    }
    el.dataset.points = String(xs.length);
    const opts = {width: Math.max(300, el.clientWidth || 420), height: 200,
                  series: [{}].concat(names.map((n, i) => ({label: n, stroke: ["#0b6bcb", "#c62828", "#18794e", "#8e44ad", "#d35400"][i % 5], spanGaps: true}))),
                  axes: [{}, {size: 60}]};
    if (plot && plot.series.length === names.length + 1) plot.setData(columns);
    else { if (plot) plot.destroy(); plot = new uPlot(opts, columns, el); }
  }
  refresh();
  setInterval(refresh, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-series-url]").forEach(drawChart);
  // Destructive actions ask first: <form data-confirm="Delete topic X?">.
  document.querySelectorAll("form[data-confirm]").forEach(form => {
    form.addEventListener("submit", ev => { if (!window.confirm(form.dataset.confirm)) ev.preventDefault(); });
  });
});
