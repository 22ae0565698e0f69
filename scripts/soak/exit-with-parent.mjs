// Preloaded (`node --import`) into the relay of `scripts/soak.mjs`, which keeps its stdin open:
// when it closes, the soak that started it is gone or done, and the relay stops as on SIGTERM.
process.stdin.on('end', () => process.kill(process.pid, 'SIGTERM')).resume()
