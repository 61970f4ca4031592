import React, { useState } from "react";

interface Props {
  label: string;
  items: Array<{ id: number; name: string }>;
}

export function List({ label, items }: Props): JSX.Element {
  const [open, setOpen] = useState<boolean>(false);
  const title = `${label} (${items.length})`;
  return (
    <section className="list">
      <button onClick={() => setOpen(!open)}>{title}</button>
      {open && (
        <ul>
          {items.map((item) => (
            <li key={item.id}>{item.name}</li>
          ))}
        </ul>
      )}
    </section>
  );
}
