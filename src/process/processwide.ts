/**
 * State that belongs to the process, not to one copy of custody. A process
 * can load custody twice (its ESM and CommonJS builds by deep import, or two
 * installed versions); the copies share one pid, one set of children and
 * one set of held state dirs, so what they record about those must be one
 * record. It is kept on globalThis under a registered symbol, where every
 * copy finds it. A name is a contract between versions: its value keeps its
 * shape, or it takes a new name.
 */
export function processWide<T>(name: string, make: () => T): T {
  const key = Symbol.for(`custody.${name}`);
  const slots = globalThis as unknown as Record<symbol, T | undefined>;
  const existing = slots[key];
  if (existing !== undefined) return existing;
  const made = make();
  slots[key] = made;
  return made;
}
