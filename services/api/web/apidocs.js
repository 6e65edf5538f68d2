// A human page for the API's OpenAPI document (GET /api/docs): paths, methods, parameters, bodies,
// responses and schemas, rendered from /api/openapi.json with no library and nothing from the
// internet. Text from the document is only ever set as text, never as HTML.

const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
};
const METHODS = ["get", "put", "post", "delete", "patch"];
const anchor = (text) => text.replace(/[^A-Za-z0-9]+/g, "-");

function schemaText(schema) {
  if (!schema) return "";
  if (schema.$ref) return schema.$ref.split("/").pop();
  if (schema.allOf) return schema.allOf.map(schemaText).join(" & ") + (schema.nullable ? " | null" : "");
  if (schema.oneOf || schema.anyOf) return (schema.oneOf || schema.anyOf).map(schemaText).join(" | ");
  let text = schema.type || (schema.enum ? "enum" : "any");
  if (schema.type === "array") text = `array of ${schemaText(schema.items)}`;
  if (schema.enum) text += ` (${schema.enum.map((v) => JSON.stringify(v)).join(", ")})`;
  if (schema.format) text += ` <${schema.format}>`;
  const bounds = [["minimum", "≥"], ["maximum", "≤"], ["minLength", "len ≥"], ["maxLength", "len ≤"],
                  ["minItems", "items ≥"], ["maxItems", "items ≤"]];
  const limits = bounds.filter(([key]) => key in schema).map(([key, sign]) => `${sign} ${schema[key]}`);
  if (limits.length) text += ` [${limits.join(", ")}]`;
  if (schema.nullable) text += " | null";
  return text;
}

function schemaLink(schema) {
  const name = schema && (schema.$ref || (schema.items && schema.items.$ref));
  const text = schemaText(schema);
  if (!name) return el("code", {}, text);
  return el("a", { href: `#schema-${anchor(name.split("/").pop())}` }, el("code", {}, text));
}

function propertiesTable(schema) {
  const props = schema.properties || {};
  const required = new Set(schema.required || []);
  const table = el("table", {}, el("tr", {}, el("th", {}, "field"), el("th", {}, "type"), el("th", {}, "meaning")));
  for (const [name, prop] of Object.entries(props)) {
    table.append(el("tr", {}, el("td", {}, el("code", {}, name), required.has(name) ? " *" : ""),
                    el("td", {}, schemaLink(prop)), el("td", { class: "desc" }, prop.description || "")));
  }
  return table;
}

function operation(path, method, op) {
  const id = anchor(op.operationId || `${method}-${path}`);
  const section = el("section", { class: "op", id },
    el("h3", {}, el("span", { class: `method ${method}` }, method), el("span", { class: "path" }, path)),
    el("p", {}, op.summary || ""));
  if (op.description) section.append(el("p", { class: "desc" }, op.description));
  const params = op.parameters || [];
  if (params.length) {
    const table = el("table", {}, el("tr", {}, el("th", {}, "parameter"), el("th", {}, "in"),
                                     el("th", {}, "type"), el("th", {}, "meaning")));
    for (const p of params) {
      table.append(el("tr", {}, el("td", {}, el("code", {}, p.name), p.required ? " *" : ""), el("td", {}, p.in),
                      el("td", {}, schemaLink(p.schema)), el("td", { class: "desc" }, p.description || "")));
    }
    section.append(el("h4", {}, "Parameters"), table);
  }
  if (op.requestBody) {
    const body = op.requestBody;
    const content = Object.entries(body.content || {});
    section.append(el("h4", {}, `Body${body.required ? "" : " (optional)"}`),
                   el("p", { class: "desc" }, body.description || ""));
    for (const [type, media] of content) section.append(el("p", {}, el("span", { class: "muted" }, `${type}: `),
                                                         schemaLink(media.schema)));
  }
  const responses = el("table", {}, el("tr", {}, el("th", {}, "status"), el("th", {}, "body"), el("th", {}, "meaning")));
  for (const [status, reply] of Object.entries(op.responses || {})) {
    const resolved = reply.$ref ? doc.components.responses[reply.$ref.split("/").pop()] : reply;
    const media = Object.values((resolved && resolved.content) || {})[0];
    responses.append(el("tr", {}, el("td", {}, status), el("td", {}, media ? schemaLink(media.schema) : ""),
                        el("td", { class: "desc" }, (resolved && resolved.description) || "")));
  }
  section.append(el("h4", {}, "Responses"), responses);
  return [id, section];
}

let doc = null;

async function render() {
  const main = document.getElementById("doc");
  const toc = document.getElementById("toc");
  const reply = await fetch("/api/openapi.json");
  if (!reply.ok) throw new Error(`GET /api/openapi.json: HTTP ${reply.status}`);
  doc = await reply.json();
  document.getElementById("title").textContent = `${doc.info.title} ${doc.info.version} (OpenAPI ${doc.openapi})`;
  main.replaceChildren(el("p", { class: "desc" }, doc.info.description || ""));
  const byTag = new Map((doc.tags || []).map((t) => [t.name, []]));
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const method of METHODS.filter((m) => item[m])) {
      const op = { ...item[method], parameters: [...(item.parameters || []), ...(item[method].parameters || [])] };
      const tag = (op.tags || ["other"])[0];
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push([path, method, op]);
    }
  }
  for (const [tag, ops] of byTag) {
    if (!ops.length) continue;
    const description = (doc.tags || []).find((t) => t.name === tag)?.description || "";
    main.append(el("h2", { id: `tag-${anchor(tag)}` }, tag), el("p", { class: "muted" }, description));
    toc.append(el("h3", {}, tag));
    for (const [path, method, op] of ops) {
      const [id, section] = operation(path, method, op);
      main.append(section);
      toc.append(el("a", { href: `#${id}` }, `${method.toUpperCase()} ${path}`));
    }
  }
  main.append(el("h2", { id: "schemas" }, "Schemas"));
  toc.append(el("h3", {}, "schemas"));
  for (const [name, schema] of Object.entries(doc.components.schemas || {})) {
    const section = el("section", { class: "op", id: `schema-${anchor(name)}` }, el("h3", {}, name));
    if (schema.description) section.append(el("p", { class: "desc" }, schema.description));
    if (schema.properties) section.append(propertiesTable(schema));
    else section.append(el("p", {}, schemaLink({ ...schema, $ref: undefined })));
    main.append(section);
    toc.append(el("a", { href: `#schema-${anchor(name)}` }, name));
  }
}

render().catch((error) => {
  document.getElementById("doc").replaceChildren(el("p", { id: "status" }, `Could not render: ${error.message}`));
});
