// What both pages run (report_page.html, plan_page.html): spotrain puts it into each page's
// script at its marker. The security policy's violations, the curves' colours, an element
// maker, and the pixel count with which a page proves in its self-check that it drew.
const violations = [];
document.addEventListener('securitypolicyviolation', e => violations.push(String(e.blockedURI || e.violatedDirective)));

// The curves' colours, none of them a marker's (green, orange, red are kept for those).
const SERIES_COLORS = ['#1f77b4', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#393b79',
                       '#637939', '#8c6d31', '#843c39', '#7b4173', '#5254a3', '#8ca252'];

const el = (tag, attrs = {}, text) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
};

// How many pixels inside a chart's plot area (legend excluded) are near a colour: the page's
// own proof that a series or a marker was drawn.
function pixelsNear(chart, canvas, hex) {
  const a = chart.chartArea, k = canvas.width / Math.max(1, canvas.clientWidth);
  const x0 = Math.floor(a.left * k), y0 = Math.floor(a.top * k);
  const w = Math.max(1, Math.floor((a.right - a.left) * k)), h = Math.max(1, Math.floor((a.bottom - a.top) * k));
  const img = canvas.getContext('2d').getImageData(x0, y0, w, h).data;
  const want = [1, 3, 5].map(i => parseInt(hex.substr(i, 2), 16));
  let n = 0;
  for (let i = 0; i < img.length; i += 4)
    if (img[i + 3] > 200 && Math.abs(img[i] - want[0]) < 24 && Math.abs(img[i + 1] - want[1]) < 24 && Math.abs(img[i + 2] - want[2]) < 24) ++n;
  return n;
}
