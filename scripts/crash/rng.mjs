// A small seeded PRNG (mulberry32): the kill schedule of a crash run is a function of its seed.

/** Returns a function yielding floats in [0, 1), determined by the 32-bit `seed`. */
export function mulberry32(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}
