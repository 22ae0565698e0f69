'use strict'
// `courier-relay inspect <client.db>`: the message ledgers of a client database drawn as one
// self-contained HTML page — an SVG timeline with a lane per peer and a mark per attempt, park,
// custody, re-drive, retry, delivery and failure, a legend, and a table of the messages
// (docs/delivery.md#a-messages-life). The ledgers are read by the native addon (the store owns
// their schema); everything here is layout, so it needs no browser and no network.

const WIDTH = 1200
const LABEL_WIDTH = 200
const PLOT_LEFT = LABEL_WIDTH + 10
const PLOT_RIGHT = WIDTH - 200
const HEADER = 64
const ROW = 18
const LANE_PAD = 10
const MAX_ROWS = 8
const LEGEND_HEIGHT = 56
/** The least distance between two marks of one message, in pixels. */
const MARK_GAP = 14

/** Lane backgrounds, in lane order (peers sorted), repeating; light enough for the marks. */
const LANE_COLORS = ['#dbeafe', '#fef3c7', '#dcfce7', '#fce7f3', '#e0e7ff', '#ccfbf1', '#fee2e2', '#ede9fe']

/** How each ledger entry is drawn: shape, colour, and its legend label. */
const MARKS = {
  accepted: { shape: 'tick', color: '#64748b', label: 'accepted' },
  attempt: { shape: 'circle', color: '#2563eb', label: 'attempt (written)' },
  deferred: { shape: 'tick', color: '#94a3b8', label: 'deferred' },
  parked: { shape: 'square', color: '#ea580c', label: 'parked (unreachable)' },
  custody: { shape: 'diamond', color: '#7c3aed', label: 'custody (relay mailbox)' },
  redriven: { shape: 'triangle', color: '#0d9488', label: 're-driven' },
  retrying: { shape: 'tick', color: '#ca8a04', label: 'retry' },
  delivered: { shape: 'big', color: '#16a34a', label: 'delivered' },
  failed: { shape: 'cross', color: '#dc2626', label: 'failed' },
  buffered: { shape: 'tick', color: '#64748b', label: 'buffered (inbound)' },
  hook_refused: { shape: 'square', color: '#be123c', label: 'hook refused' },
  received: { shape: 'big', color: '#15803d', label: 'received' },
  decryption_failed: { shape: 'cross', color: '#9f1239', label: 'did not decrypt' },
  expired: { shape: 'cross', color: '#dc2626', label: 'expired' },
}

const escape = (s) =>
  String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c])

const short = (s, n) => (s.length > n ? `${s.slice(0, n - 1)}…` : s)

const iso = (ms) => new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC')

/**
 * Where everything goes: the time range, and per peer (sorted by label) its lane's `y`, `height`,
 * `color` and messages, each with its row. The picture's test reads the lanes from here.
 */
function layout(timelines, labels = {}) {
  const times = timelines.flatMap((t) => t.entries.map((e) => e.at))
  const start = times.length > 0 ? Math.min(...times) : 0
  const end = Math.max(times.length > 0 ? Math.max(...times) : 0, start + 1000)
  const name = (peer) => labels[peer] ?? peer
  const peers = [...new Set(timelines.map((t) => t.peer))].sort((a, b) => name(a).localeCompare(name(b)))
  let y = HEADER
  const lanes = peers.map((peer, i) => {
    const messages = timelines
      .filter((t) => t.peer === peer)
      .sort((a, b) => (a.entries[0]?.at ?? 0) - (b.entries[0]?.at ?? 0))
    const rows = Math.min(messages.length, MAX_ROWS)
    const lane = { peer, label: name(peer), y, height: LANE_PAD * 2 + rows * ROW, color: LANE_COLORS[i % LANE_COLORS.length], messages }
    y += lane.height + 4
    return lane
  })
  return { width: WIDTH, height: y + LEGEND_HEIGHT, start, end, lanes }
}

function mark(shape, x, y, color) {
  switch (shape) {
    case 'circle':
      return `<circle cx="${x}" cy="${y}" r="4" fill="${color}"/>`
    case 'big':
      return `<circle cx="${x}" cy="${y}" r="7" fill="${color}" stroke="#fff" stroke-width="1.5"/>`
    case 'square':
      return `<rect x="${x - 5}" y="${y - 5}" width="10" height="10" fill="${color}"/>`
    case 'diamond':
      return `<path d="M${x} ${y - 7}L${x + 7} ${y}L${x} ${y + 7}L${x - 7} ${y}Z" fill="${color}"/>`
    case 'triangle':
      return `<path d="M${x - 6} ${y + 5}L${x + 6} ${y + 5}L${x} ${y - 6}Z" fill="${color}"/>`
    case 'cross':
      return `<path d="M${x - 6} ${y - 6}L${x + 6} ${y + 6}M${x + 6} ${y - 6}L${x - 6} ${y + 6}" stroke="${color}" stroke-width="3"/>`
    default:
      return `<line x1="${x}" y1="${y - 6}" x2="${x}" y2="${y + 6}" stroke="${color}" stroke-width="2"/>`
  }
}

function svg(plan, title) {
  const { width, height, start, end, lanes } = plan
  const x = (at) => PLOT_LEFT + ((at - start) / (end - start)) * (PLOT_RIGHT - PLOT_LEFT)
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif">`,
    `<rect width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="16" y="26" font-size="18" font-weight="bold" fill="#0f172a">${escape(title)}</text>`,
    `<text x="16" y="48" font-size="12" fill="#475569">${escape(iso(start))} → ${escape(iso(end))} · ${lanes.length} peers · ${lanes.reduce((n, l) => n + l.messages.length, 0)} messages</text>`,
  ]
  for (const lane of lanes) {
    out.push(`<rect x="0" y="${lane.y}" width="${width}" height="${lane.height}" fill="${lane.color}"/>`)
    out.push(`<text x="12" y="${lane.y + lane.height / 2 + 4}" font-size="13" fill="#0f172a"><title>${escape(lane.peer)}</title>${escape(short(lane.label, 24))}</text>`)
    lane.messages.forEach((message, i) => {
      const rowY = lane.y + LANE_PAD + (i % MAX_ROWS) * ROW + ROW / 2
      const first = message.entries[0]?.at ?? start
      const last = message.entries.at(-1)?.at ?? first
      out.push(`<g><title>${escape(`${message.direction} ${message.id} (${message.outcome ?? 'pending'})`)}</title>`)
      // Marks closer than MARK_GAP are pushed apart, in order: each stays visible.
      // A long ledger packs its marks closer, so that none leaves the page.
      const shown = message.entries.filter((e) => MARKS[e.kind])
      const gap = Math.min(MARK_GAP, (WIDTH - 24 - x(first)) / Math.max(1, shown.length - 1))
      const marks = []
      for (const entry of shown) {
        const at = Math.max(x(entry.at), marks.length > 0 ? marks.at(-1).x + gap : -Infinity)
        marks.push({ x: Math.min(at, WIDTH - 24), style: MARKS[entry.kind] })
      }
      const end = Math.max(x(last), x(first) + 1, marks.at(-1)?.x ?? 0)
      out.push(`<line x1="${x(first)}" y1="${rowY}" x2="${end}" y2="${rowY}" stroke="#334155" stroke-width="1.5"/>`)
      for (const { x: at, style } of marks) out.push(mark(style.shape, at, rowY, style.color))
      out.push('</g>')
    })
  }
  const legendY = height - LEGEND_HEIGHT + 20
  const legend = ['attempt', 'parked', 'custody', 'redriven', 'retrying', 'delivered', 'failed', 'hook_refused', 'received']
  legend.forEach((kind, i) => {
    const lx = 16 + (i % 5) * 230
    const ly = legendY + Math.floor(i / 5) * 22
    const style = MARKS[kind]
    out.push(mark(style.shape, lx + 6, ly, style.color))
    out.push(`<text x="${lx + 18}" y="${ly + 4}" font-size="12" fill="#0f172a">${escape(style.label)}</text>`)
  })
  out.push('</svg>')
  return out.join('\n')
}

function table(timelines) {
  const rows = timelines.map(
    (t) =>
      `<tr><td>${escape(t.direction)}</td><td>${escape(t.id)}</td><td>${escape(t.peer)}</td><td>${escape(t.outcome ?? 'pending')}</td><td>${escape(t.entries.map((e) => e.kind).join(' → '))}</td></tr>`,
  )
  return `<table><thead><tr><th>direction</th><th>id</th><th>peer</th><th>outcome</th><th>ledger</th></tr></thead><tbody>${rows.join('')}</tbody></table>`
}

/**
 * The page for `timelines` (as `messageTimeline` answers them), most recent first; `labels`
 * names peers (address → name) on their lanes.
 */
function render(timelines, { title = 'offline-courier: recent messages', labels = {} } = {}) {
  const plan = layout(timelines, labels)
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title>
<style>body{margin:0;font-family:sans-serif;color:#0f172a}svg{display:block}table{border-collapse:collapse;margin:16px;font-size:12px}td,th{border:1px solid #cbd5e1;padding:3px 6px;text-align:left;vertical-align:top}</style>
</head><body>
${svg(plan, title)}
${table(timelines)}
</body></html>
`
}

module.exports = { render, layout, LANE_COLORS, MARKS }
