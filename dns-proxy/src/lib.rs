//! The agent's DNS proxy: answers mesh names from the NDS name table, forwards the rest.
