// Preloaded (`node --import`) into the relays of `bench/compare.mjs`, which keep their stdin open
// for them: when it closes, the run that started them is gone, and the relay stops as on SIGTERM
// instead of outliving it.
process.stdin.on('end', () => process.kill(process.pid, 'SIGTERM')).resume()
