"""fio interoperability: job files in, fio's JSON schema out."""
