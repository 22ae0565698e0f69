// The demo's terminal: the timeline, one line per step, and the live progress of file transfers
// drawn from `file_progress` events. On a terminal each transfer's direction has a bar pinned
// under the timeline and redrawn in place (timeline lines are written above it); piped into a
// file or a CI log, where redrawing only makes noise, a transfer prints a plain timeline line
// each time it passes another quarter.

const MiB = 1024 * 1024
const BAR_WIDTH = 16
/** Progress events come at most four times a second: a bar still after this long has stalled. */
const STALL_MS = 1000
const REDRAW_MS = 250

export const mib = (bytes) => `${(bytes / MiB).toFixed(1)} MiB`

/**
 * `nameOf` turns a peer's address into the name the timeline shows. `t0` is the demo's start,
 * the origin of the timeline's clock.
 */
export function createScreen({ nameOf, t0, out = process.stdout }) {
  const live = out.isTTY === true
  /** `fileId/direction` → { who, event, at (when it last moved), quarter (last one printed) } */
  const bars = new Map()
  /** Bar lines on the screen under the timeline, erased before anything is written above them. */
  let drawn = 0
  let ticker = null

  const erase = () => {
    if (drawn > 0) out.write(`\x1b[${drawn}A\r\x1b[J`)
    drawn = 0
  }
  const draw = () => {
    // Wider than the terminal, a line would wrap and moving up `drawn` lines would miss: the
    // details at the end of a bar's line go first when it is narrow.
    const width = (out.columns || 80) - 1
    const now = Date.now()
    for (const bar of bars.values()) {
      const [line, ...details] = describe(bar, now)
      let fitted = `  ${bar.who.padEnd(7)} ${line}`
      for (const detail of details) {
        if (fitted.length + 2 + detail.length > width) break
        fitted += `  ${detail}`
      }
      out.write(`${fitted.slice(0, width).trimEnd()}\n`)
    }
    drawn = bars.size
  }
  /** A bar's line: what it shows first, then the details, least needed last. */
  const describe = ({ event: e, at }, now) => {
    const share = e.totalBytes === 0 ? 1 : e.bytes / e.totalBytes
    const filled = Math.round(share * BAR_WIDTH)
    const pace = e.bytes >= e.totalBytes
      ? 'done'
      : now - at > STALL_MS
        ? `stalled ${((now - at) / 1000).toFixed(1)} s`
        : e.etaMs === null ? 'ETA …' : `ETA ${(e.etaMs / 1000).toFixed(1)} s`
    const line = [
      (e.direction === 'outgoing' ? `acked by ${nameOf(e.peer)}` : 'written').padEnd(12),
      `[${'█'.repeat(filled)}${'░'.repeat(BAR_WIDTH - filled)}]`,
      `${Math.floor(share * 100)}%`.padStart(4),
      `${(e.bytes / MiB).toFixed(1).padStart(4)}/${mib(e.totalBytes)}`,
    ].join(' ')
    return [line, pace.padEnd(13), `${mib(e.bytesPerSecond)}/s`.padStart(10), `${e.chunks}/${e.totalChunks} chunks`]
  }

  const redraw = () => {
    erase()
    draw()
  }
  const print = (line) => {
    erase()
    out.write(`${line}\n`)
    if (live) draw()
  }
  const log = (who, what) => print(`${((Date.now() - t0) / 1000).toFixed(2).padStart(6)}s  ${who.padEnd(7)} ${what}`)

  /** A `file_progress` event seen by the peer named `who`. */
  const progress = (who, event) => {
    const key = `${event.fileId}/${event.direction}`
    const bar = bars.get(key) ?? { who, quarter: 0 }
    bars.set(key, Object.assign(bar, { event, at: Date.now() }))
    if (live) {
      // The ticker redraws between events, so a bar that stops moving says for how long.
      ticker ??= setInterval(redraw, REDRAW_MS)
      redraw()
      return
    }
    const quarter = event.totalBytes === 0 ? 4 : Math.floor((4 * event.bytes) / event.totalBytes)
    if (quarter <= bar.quarter) return
    bar.quarter = quarter
    const [line, ...details] = describe(bar, Date.now())
    log(who, [line, ...details.map((detail) => detail.trim())].join('  '))
  }

  /** The transfers shown are over: their bars stay as they last were, and lines go below them. */
  const settle = () => {
    clearInterval(ticker)
    ticker = null
    if (live) redraw()
    drawn = 0
    bars.clear()
  }

  return { print, log, progress, settle }
}
